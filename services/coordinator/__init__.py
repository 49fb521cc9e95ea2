"""The coordinator service: placement of partition groups and its durable record, migrations
between workers, the adaptive placement policy, the ring's duties and the status view."""
