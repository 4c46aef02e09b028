"""The ``ax`` protobuf package."""
