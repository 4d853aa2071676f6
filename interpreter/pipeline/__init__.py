"""A graph split over processes (mx.distributed): the plan, the link, the session."""
