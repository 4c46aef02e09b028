"""``ax.v1``: stored messages (``TaskSnapshot``, ``Task``, ``Event``...) and gRPC services.

``ax_pb2``, ``ax_pb2.pyi`` and ``ax_pb2_grpc`` are generated from ``ax.proto`` by
``scripts/gen-proto`` and committed; ``tests/test_proto_drift.py`` fails when they are
out of date. Do not edit them by hand.
"""
