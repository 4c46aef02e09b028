"""Property: random messages, metadata and raw bytes at every gRPC method.

The methods are enumerated from the generated descriptors (``ax_pb2.DESCRIPTOR``), and
the requests are built from the message descriptors: every field random (real ids of a
paused and a finished task or hostile strings, JSON text with NaN/Infinity/deep nesting
in ``*_json`` fields, DAG YAML documents, ``output_ref`` blob references with odd
sha256/uri/size, real and wrong fences, unknown enum values, NaN/Inf doubles), sent with
each token kind, none or garbage metadata — and raw garbage bytes (random, or a valid
message with bytes flipped) through a generic ``channel.unary_unary(method,
request_serializer=None)``.

Every call must end within :data:`CALL_TIMEOUT` with OK or a client-error code; a
``WatchTask`` stream must end by itself when its task is final or absent, and be
cancellable otherwise. After every refused call (non-OK, or an OK answer that the proto
documents as "nothing changed": STALE, NOT_CLAIMABLE, NOT_YET, ALREADY_DONE) the store
must be unchanged (:func:`tests.security.fuzz.unchanged`).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import assume, given
from hypothesis import strategies as st

from proto.ax.v1 import ax_pb2 as pb
from tests.security.conftest import store_state
from tests.security.fuzz import (
    CALL_TIMEOUT,
    HOSTILE_STRINGS,
    NODE_IDS,
    WHO,
    Findings,
    World,
    close_world,
    dag_yaml,
    fuzz_settings,
    hostile_text,
    json_text,
    make_world,
    short,
    unchanged,
)
from tests.topology import Topology

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Examples per method (each stays well under 15 s on 2 cores).
EXAMPLES = int(os.environ.get("AX_FUZZ_EXAMPLES", "120"))
#: Seconds an open watch of a task that is not final is left running before cancel.
STREAM_PEEK = 0.5

ALLOWED = {
    grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.ABORTED,
}

#: Every method this module fuzzes.
METHODS = (
    "/ax.v1.AxService/SubmitTask",
    "/ax.v1.AxService/GetTask",
    "/ax.v1.AxService/ListTasks",
    "/ax.v1.AxService/GetEvents",
    "/ax.v1.AxService/WatchTask",
    "/ax.v1.AxService/Decide",
    "/ax.v1.AxService/ResumeNode",
    "/ax.v1.AxService/CancelTask",
    "/ax.v1.AxService/RetryTask",
    "/ax.v1.AxService/ForkTask",
    "/ax.v1.AxService/ValidateDag",
    "/ax.v1.ExecutorService/Claim",
    "/ax.v1.ExecutorService/Heartbeat",
    "/ax.v1.ExecutorService/Progress",
    "/ax.v1.ExecutorService/Checkpoint",
    "/ax.v1.ExecutorService/Complete",
    "/ax.v1.ExecutorService/CompleteStream",
    "/ax.v1.ExecutorService/EffectBegin",
    "/ax.v1.ExecutorService/EffectDone",
    "/ax.v1.ExecutorService/EffectGet",
    "/ax.v1.ExecutorService/GetRun",
    "/ax.v1.ExecutorService/Take",
)


def descriptor_methods() -> dict[str, Any]:
    """``/package.Service/Method`` -> method descriptor, for every service of the proto."""
    return {f"/{service.full_name}/{method.name}": method
            for service in pb.DESCRIPTOR.services_by_name.values()
            for method in service.methods}


def test_every_method_is_fuzzed() -> None:
    """A method added to the proto without being added to METHODS fails here."""
    declared = set(descriptor_methods())
    assert declared - set(METHODS) == set(), f"not fuzzed: {sorted(declared - set(METHODS))}"
    assert set(METHODS) - declared == set(), f"gone: {sorted(set(METHODS) - declared)}"


# ---------------------------------------------------------------------------- messages

_FD = FieldDescriptor
_WEIRD_SHA = st.one_of(
    st.sampled_from(["", "0" * 64, "f" * 64, "F" * 64, "0" * 63, "0" * 65, "g" * 64,
                     "../../../../etc/passwd", "..", "/etc/passwd", "@blob", "@blob/..",
                     "%2e%2e", "0" * 64 + "\x00", "0" * 10000, "*"]),
    hostile_text(70),
    st.from_regex(r"[0-9a-f]{64}", fullmatch=True),
)
_URI = st.one_of(
    st.sampled_from(["", "file:///etc/passwd", "file:///proc/self/environ", "../../x",
                     "/etc/passwd", "blob://x", "http://127.0.0.1:1/", "s3://b/k",
                     "sha256:" + "0" * 64, "\x00"]),
    hostile_text(60),
)
_FENCE = st.one_of(st.sampled_from([0, 1, 2, 3, -1, 2**63 - 1, -(2**63), "@fence"]),
                   st.integers(-(2**63), 2**63 - 1))
#: A Take's wait: hostile values, but no more than a blink when valid (a valid wait
#: holds the call open that long, up to 30 s, whatever else it carries).
_WAIT = st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, -1.0, -0.0, 0.0, 1e-300,
                                   -1e308]), st.floats(0.0, 0.05))
_DOUBLE = st.one_of(st.floats(), st.sampled_from([0.0, -0.0, 1e-300, 1e308, -1.0, 0.001,
                                                  3600.0, 10**10]))


def _string(name: str) -> st.SearchStrategy[str]:
    if name in ("task_id",):
        return st.one_of(st.sampled_from(["@gate", "@done", "@gate", "@done"]),
                         hostile_text())
    if name in ("node_id", "from_node", "target_node_id"):
        return st.one_of(st.sampled_from(NODE_IDS), hostile_text())
    if name == "dag_hash":
        return st.one_of(st.sampled_from(["@ghash", "@dhash"]),
                         st.from_regex(r"[0-9a-f]{8,128}", fullmatch=True), hostile_text())
    if name == "dag_yaml":
        return dag_yaml()
    if name.endswith("_json"):
        return json_text()
    if name == "sha256":
        return _WEIRD_SHA
    if name == "uri":
        return _URI
    if name == "page_token":
        return st.one_of(st.sampled_from(["@gate", "@done"]), hostile_text())
    if name == "label_selector":
        return st.one_of(st.sampled_from(["a=b", "a!=b", "a", "=x", ",,", "a=b=c"]),
                         hostile_text())
    if name == "key":
        return st.one_of(st.sampled_from(["k", "@gate/draft/x", "../x", "/ax/tasks/@gate",
                                          "a" * 300]), hostile_text())
    return st.one_of(hostile_text(), st.sampled_from(HOSTILE_STRINGS))


def _scalar(fd: Any, depth: int) -> st.SearchStrategy[Any]:
    t = fd.type
    if t == _FD.TYPE_MESSAGE:
        return message_spec(fd.message_type, depth + 1)
    if t == _FD.TYPE_STRING:
        return _string(fd.name)
    if t == _FD.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == _FD.TYPE_BOOL:
        return st.booleans()
    if t == _FD.TYPE_ENUM:
        known = [v.number for v in fd.enum_type.values]
        return st.one_of(st.sampled_from(known), st.sampled_from(known),
                         st.integers(-3, 40), st.just(2**31 - 1))
    if t in (_FD.TYPE_DOUBLE, _FD.TYPE_FLOAT):
        if fd.name == "wait_seconds":
            return _WAIT
        return _DOUBLE if t == _FD.TYPE_DOUBLE else st.floats(width=32)
    if t in (_FD.TYPE_INT64, _FD.TYPE_SINT64, _FD.TYPE_SFIXED64):
        if fd.name == "fence":
            return _FENCE
        return st.one_of(st.sampled_from([0, 1, -1, 2**63 - 1, -(2**63), 10**12]),
                         st.integers(-(2**63), 2**63 - 1))
    if t in (_FD.TYPE_INT32, _FD.TYPE_SINT32, _FD.TYPE_SFIXED32):
        return st.one_of(st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31), 1000, 1001,
                                          10000, 10001]),
                         st.integers(-(2**31), 2**31 - 1))
    if t in (_FD.TYPE_UINT64, _FD.TYPE_FIXED64):
        return st.integers(0, 2**64 - 1)
    return st.integers(0, 2**32 - 1)


def _is_map(fd: Any) -> bool:
    return fd.message_type is not None and fd.message_type.GetOptions().map_entry


@st.composite
def message_spec(draw: st.DrawFn, desc: Descriptor, depth: int = 0) -> dict[str, Any]:
    """A random request as a tree of field values (placeholders resolved later)."""
    spec: dict[str, Any] = {"__type__": desc.full_name}
    if depth > 3:
        return spec
    oneof_choice = {o.name: draw(st.one_of(st.none(), st.sampled_from(
        [f.name for f in o.fields]))) for o in desc.oneofs}
    for fd in desc.fields:
        if fd.containing_oneof is not None:
            if oneof_choice[fd.containing_oneof.name] != fd.name:
                continue
        elif not draw(st.integers(0, 5)):
            continue  # leave some fields at their defaults
        if _is_map(fd):
            key_fd = fd.message_type.fields_by_name["key"]
            value_fd = fd.message_type.fields_by_name["value"]
            spec[fd.name] = draw(st.dictionaries(_scalar(key_fd, depth), _scalar(value_fd,
                                                                                 depth),
                                                 max_size=3))
        elif fd.is_repeated:
            spec[fd.name] = draw(st.lists(_scalar(fd, depth), max_size=3))
        else:
            spec[fd.name] = draw(_scalar(fd, depth))
    return spec


def build(desc: Descriptor, spec: dict[str, Any], world: World) -> Any:
    """The protobuf message of a spec, with the world's ids in place of placeholders."""
    from google.protobuf import message_factory

    cls = message_factory.GetMessageClass(desc)
    msg = cls()
    for name, value in spec.items():
        if name == "__type__":
            continue
        fd = desc.fields_by_name[name]
        if _is_map(fd):
            target = getattr(msg, name)
            for k, v in value.items():
                target[_resolve(k, world)] = _resolve(v, world)
        elif fd.is_repeated:
            if fd.type == _FD.TYPE_MESSAGE:
                for item in value:
                    getattr(msg, name).add().CopyFrom(build(fd.message_type, item, world))
            else:
                getattr(msg, name).extend(_resolve(v, world) for v in value)
        elif fd.type == _FD.TYPE_MESSAGE:
            getattr(msg, name).CopyFrom(build(fd.message_type, value, world))
        else:
            setattr(msg, name, _resolve(value, world))
    return msg


def _resolve(value: Any, world: World) -> Any:
    if value == "@fence":
        return max(world.fences)
    if isinstance(value, str):
        value = world.resolve(value)
        if "@blob" in value and world.blob_shas:
            value = value.replace("@blob", world.blob_shas[0])
    return value


def metadata() -> st.SearchStrategy[list[tuple[str, Any]]]:
    printable = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=40)
    who = st.sampled_from(WHO)
    return st.one_of(
        who.map(lambda w: [("authorization", f"Bearer @tok:{w}")] if w else []),
        who.map(lambda w: [("authorization", f"Bearer @tok:{w}")] if w else []),
        st.sampled_from([
            [("authorization", "Bearer")], [("authorization", "Bearer ")],
            [("authorization", "bearer @tok:admin")], [("authorization", "Basic eDp5")],
            [("authorization", "Bearer @tok:approver"), ("authorization", "Bearer @tok:admin")],
            [("authorization", "Bearer @tok:executor"), ("authorization", "Bearer x")],
            [("authorization", "Bearer " + "A" * 7000)],
            [("authorization", "Bearer @tok:admin "), ("x-forwarded-for", "127.0.0.1")],
            [("authorization-bin", b"\x00\xff")],
        ]),
        printable.map(lambda s: [("authorization", "Bearer " + s)]),
        st.lists(st.tuples(st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True)
                           .filter(lambda k: not k.startswith("grpc-")), printable),
                 max_size=3),
    )


def _md(md: list[tuple[str, Any]], world: World) -> list[tuple[str, Any]]:
    out = []
    for key, value in md:
        if isinstance(value, str):
            for who in ("admin", "submitter2", "submitter", "approver", "executor"):
                value = value.replace(f"@tok:{who}", world.token(who))
        out.append((key, value))
    return out


#: Principals allowed to call each method (reads: any role).
ALLOWED_WHO = {
    "SubmitTask": ("admin", "submitter", "submitter2"), "ValidateDag": ("submitter", "admin"),
    "Decide": ("approver", "admin"), "ResumeNode": ("approver", "admin"),
    "CancelTask": ("admin",), "RetryTask": ("admin",),
    "ForkTask": ("admin",),
    **{m: ("executor",) for m in ("Claim", "Heartbeat", "Progress", "Checkpoint", "Complete",
                                  "CompleteStream", "EffectBegin", "EffectDone", "EffectGet",
                                  "GetRun", "Take")},
}


@st.composite
def calls(draw: st.DrawFn, method: str) -> dict[str, Any]:
    desc = descriptor_methods()[method]
    raw = draw(st.integers(0, 5)) == 0
    spec = draw(message_spec(desc.input_type))
    name = method.rsplit("/", 1)[1]
    if draw(st.integers(0, 9)) < 5:  # the right token for the method
        who = draw(st.sampled_from(ALLOWED_WHO.get(name, ("admin", "submitter", "approver",
                                                          "executor"))))
        md = [("authorization", f"Bearer @tok:{who}")]
    else:
        md = draw(metadata())
    out: dict[str, Any] = {"spec": spec, "md": md, "raw": None}
    if raw:
        out["raw"] = draw(st.one_of(
            st.binary(max_size=200),
            st.tuples(st.integers(0, 10**6), st.binary(min_size=1, max_size=4)),
        ))
    return out


def raw_bytes(raw: Any, desc: Descriptor, spec: dict[str, Any], world: World) -> bytes:
    if isinstance(raw, bytes):
        return raw
    where, junk = raw  # a valid message with some bytes overwritten
    data = bytearray(build(desc, spec, world).SerializeToString())
    if not data:
        return bytes(junk)
    at = where % len(data)
    data[at:at + len(junk)] = junk
    return bytes(data)


# ---------------------------------------------------------------------------- the test


@pytest.fixture(scope="module")
def world(topology: Topology) -> Iterator[World]:
    w = make_world(topology)
    try:
        yield w
    finally:
        close_world(w)


@pytest.fixture(scope="module")
def channel(topology: Topology) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(topology.grpc_target) as ch:
        grpc.channel_ready_future(ch).result(timeout=30)
        yield ch


#: Fields of OK replies that mean "refused, nothing changed" (see ax.proto).
_NOTHING_CHANGED = {
    "Claim": ("result", {pb.CLAIM_RESULT_NOT_CLAIMABLE, pb.CLAIM_RESULT_NOT_YET}),
    "Heartbeat": ("result", {pb.LEASE_RESULT_STALE}),
    "Progress": ("result", {pb.LEASE_RESULT_STALE}),
    "Complete": ("result", {pb.COMPLETE_RESULT_STALE, pb.COMPLETE_RESULT_ALREADY_DONE}),
    "CompleteStream": ("result", {pb.COMPLETE_RESULT_STALE,
                                  pb.COMPLETE_RESULT_ALREADY_DONE}),
    "EffectBegin": ("lease", {pb.LEASE_RESULT_STALE}),
    "EffectDone": ("lease", {pb.LEASE_RESULT_STALE}),
    # GetRun changes nothing whatever it answers.
    "GetRun": ("result", {pb.LEASE_RESULT_OK, pb.LEASE_RESULT_STALE}),
}


def _unary(channel: grpc.Channel, method: str, request: Any, md: list[tuple[str, Any]],
           raw: bool) -> tuple[grpc.StatusCode, Any, str]:
    desc = descriptor_methods()[method]
    from google.protobuf import message_factory

    reply_cls = message_factory.GetMessageClass(desc.output_type)
    stub = channel.unary_unary(
        method,
        request_serializer=None if raw else type(request).SerializeToString,
        response_deserializer=None if raw else reply_cls.FromString)
    try:
        reply = stub(request, metadata=md or None, timeout=CALL_TIMEOUT)
    except grpc.RpcError as exc:
        return exc.code(), None, exc.details() or ""
    if raw:
        reply = reply_cls.FromString(reply)
    return grpc.StatusCode.OK, reply, ""


def _complete_stream(channel: grpc.Channel, request: Any, md: list[tuple[str, Any]],
                     raw: bool) -> tuple[grpc.StatusCode, Any, str]:
    """One message on a ``CompleteStream``, then the end of sending: the stream's status,
    or the message's own (its reply's code) with the ``CompleteReply`` when it is OK."""
    stub = channel.stream_stream(
        "/ax.v1.ExecutorService/CompleteStream",
        request_serializer=None if raw else type(request).SerializeToString,
        response_deserializer=pb.CompleteStreamReply.FromString)
    try:
        replies = list(stub(iter([request]), metadata=md or None, timeout=CALL_TIMEOUT))
    except grpc.RpcError as exc:
        return exc.code(), None, exc.details() or ""
    if len(replies) != 1:
        return grpc.StatusCode.INTERNAL, None, f"{len(replies)} replies to one request"
    reply = replies[0]
    if not raw and reply.id != request.id:
        return grpc.StatusCode.INTERNAL, None, f"reply id {reply.id} for request {request.id}"
    code = {c.value[0]: c for c in grpc.StatusCode}.get(reply.code, grpc.StatusCode.UNKNOWN)
    return code, reply.reply if code == grpc.StatusCode.OK else None, reply.message


def _watch(channel: grpc.Channel, world: World, request: Any, md: list[tuple[str, Any]],
           raw: bool, task_id: str, findings: Findings, what: str
           ) -> tuple[grpc.StatusCode, str]:
    stub = channel.unary_stream(
        "/ax.v1.AxService/WatchTask",
        request_serializer=None if raw else type(request).SerializeToString,
        response_deserializer=None if raw else pb.Event.FromString)
    call = stub(request, metadata=md or None, timeout=CALL_TIMEOUT)
    box: dict[str, Any] = {}
    done = threading.Event()

    def consume() -> None:
        try:
            for _ in call:
                box["n"] = box.get("n", 0) + 1
            box["code"] = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            box["code"], box["details"] = exc.code(), exc.details() or ""
        finally:
            done.set()

    threading.Thread(target=consume, daemon=True).start()
    task = world.probe.task(task_id)
    must_end = task is None or task.status.final
    if done.wait(CALL_TIMEOUT + 2 if must_end else STREAM_PEEK):
        return box["code"], box.get("details", "")
    if must_end:
        findings.add("watch of a final/absent task did not end", "WatchTask", what,
                     "still open")
    call.cancel()
    if not done.wait(5):
        findings.add("watch not cancellable", "WatchTask", what, "still open after cancel")
    return grpc.StatusCode.OK, "open stream (cancelled by the client)"


def exercise(topology: Topology, world: World, channel: grpc.Channel, findings: Findings,
             method: str, call: dict[str, Any]) -> None:
    desc = descriptor_methods()[method]
    name = method.rsplit("/", 1)[1]
    try:
        request = build(desc.input_type, call["spec"], world)
        if call["raw"] is not None:
            request = raw_bytes(call["raw"], desc.input_type, call["spec"], world)
    except (ValueError, TypeError, OverflowError):
        assume(False)  # not expressible as this message (client-side refusal)
        return
    md = _md(call["md"], world)
    what = (f"{name} raw={short(request, 300)}" if isinstance(request, bytes) else
            f"{name}({short(str(request).replace(chr(10), ' '), 700)})") + \
        f" metadata={short([(k, short(v, 60)) for k, v in call['md']], 200)}"
    world.quiesce()
    before = store_state(topology)
    findings.mark()
    try:
        if name == "WatchTask":
            task_id = world.resolve(call["spec"].get("task_id", ""))
            code, details = _watch(channel, world, request, md, isinstance(request, bytes),
                                   task_id, findings, what)
            reply = None
        elif name == "CompleteStream":
            code, reply, details = _complete_stream(channel, request, md,
                                                    isinstance(request, bytes))
        else:
            code, reply, details = _unary(channel, method, request, md,
                                          isinstance(request, bytes))
    except ValueError as exc:  # metadata the client library refuses to send
        if "metadata" in str(exc).lower():
            assume(False)
        raise
    findings.count(code.name)
    if code not in ALLOWED:
        findings.add(f"status {code.name}", name, what, f"{code.name}: {short(details, 300)}")
    refused = code != grpc.StatusCode.OK
    if reply is not None and name in _NOTHING_CHANGED:
        field, values = _NOTHING_CHANGED[name]
        refused = getattr(reply, field) in values
    if refused:
        after = store_state(topology)
        changed = unchanged(world.probe, before, after)
        if changed:
            answer = code.name if code != grpc.StatusCode.OK else f"OK {short(str(reply), 200)}"
            findings.add(f"store changed by refused call ({answer.split()[0]})", name, what,
                         f"{answer} | {changed}")


@pytest.mark.parametrize("method", METHODS)
def test_fuzz_method(topology: Topology, world: World, channel: grpc.Channel,
                     method: str) -> None:
    world.ensure()
    findings = Findings(topology)

    @fuzz_settings(EXAMPLES)
    @given(call=calls(method))
    def run(call: dict[str, Any]) -> None:
        exercise(topology, world, channel, findings, method, call)

    run()
    findings.check()
