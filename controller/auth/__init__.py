"""Who is calling: tokens issued and checked on every request (tokens.py), and a user's
self-service credentials (credentials.py). Imports the kernel, context, security/ and monitoring/."""
