"""serve_app: the logic of the serving system, importable without a running cluster."""
