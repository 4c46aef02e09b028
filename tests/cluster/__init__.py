"""The scaled-out topology: API + executors on real etcd and Redis, and its faults."""
