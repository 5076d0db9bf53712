"""Who asks what, when: plain Locust users, load shapes and seeded workloads. Knows nothing of the store."""
