"""Request priority classes (``add_request(priority=...)``, ``Request.priority``): higher runs first.

``PRIORITY_INTERACTIVE`` is a session step's class (a front's turn, a realtime step), above
``PRIORITY_BATCH`` (plain requests, back-end work). How the scheduler orders and budgets the
classes is ``engine/scheduler.py``'s contract.
"""

PRIORITY_BATCH = 0
PRIORITY_INTERACTIVE = 1
