"""The documentation routes: /docs, /redoc, the OpenAPI document and the playground."""
