"""Admission: the webhooks (review.py, pure), their HTTPS server and configurations, what
the operator installs into the cluster, and the hold (gates, suspended Jobs) they put on work."""
