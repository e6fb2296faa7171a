"""Ray Serve deployment classes: thin shells over `serve_app` logic.

They stay plain classes; `serve_app.app` applies `serve.deployment(...)` from config.
"""
