"""The HTTP session API (``/v1/sessions...``: ``routes.py``), session migration between servers
(``migration.py``) and their error statuses (``errors.py``)."""
