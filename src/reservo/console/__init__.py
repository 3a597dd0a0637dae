"""The operators' console (/console): server-rendered pages (Jinja2 + htmx,
served by the service itself) for an admin signed in with a session cookie.
Pages read cheap figures and act only through the modules' use cases."""
