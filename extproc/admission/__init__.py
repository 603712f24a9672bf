"""Admission: who calls (auth), may it go now (budgets, buckets, slots and queues), where it goes (dispatch, the routing outcome)."""
