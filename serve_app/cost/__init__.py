"""What requests cost: the meter the ingress runs."""
