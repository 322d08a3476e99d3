"""The ASGI plumbing under every protocol: middleware, authentication, budgets, headers, worker slots."""
