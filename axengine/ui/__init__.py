"""The web UI: its page and files (static/), and vendored assets (vendor/)."""
