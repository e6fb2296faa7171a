"""What requests cost: the price book with every price's date and source
(`prices`, `prices.yaml`), the meter the ingress runs (`meter`), and the monthly
plan (`measured` reads benchmark JSONs, `plan` does the arithmetic)."""
