"""Queue-duration autoscaling: the ingress-policy metric contract, the pure policy, its Ray adapter and entry."""
