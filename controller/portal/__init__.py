"""The cloud portal's service side (api/portal/ is the web side): its sessions (sessions.py) and
what each page shows (views.py). Imports any package below it; nothing imports it but api/."""
