"""The server's own routes: /v1/generate, /v1/translate, /v1/classify, health and metrics."""
