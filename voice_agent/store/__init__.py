"""Where call records live: SQLite by default, PostgreSQL for several hosts; see base.py."""

from voice_agent.store.base import CallStore, open_store
from voice_agent.store.outcomes import OUTCOMES, outcome_for

__all__ = ["OUTCOMES", "CallStore", "open_store", "outcome_for"]
