"""What the stand-in says and checks the way a Kubernetes API server does: ``Status`` errors,
object names, labels, label and field selectors, and strict schema validation.

Pure functions over JSON values; :mod:`tests.k8s.standin` is the only caller. The message
formats follow ``k8s.io/apimachinery`` (``NewNotFound``, ``NewAlreadyExists``,
``NewInvalid``, ``NewResourceExpired``) so a client that reads ``Status.reason`` and
``Status.code`` sees what it would see from a real server.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import jsonschema
import referencing
from kubernetes_validate import utils as kv

#: The Kubernetes version whose strict JSON schemas validate every object.
SCHEMA_VERSION = "1.37.0"

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*"
_QUALIFIED_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE = rf"({_QUALIFIED_NAME})?"

JSON = dict[str, Any]


def now() -> str:
    """The current time as Kubernetes writes it (RFC 3339, seconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- Status errors -------------------------------------------------------------------------


class ApiFailure(Exception):
    """A request the API answers with a ``Status`` (``kind: Status``, ``code``, ``reason``)."""

    def __init__(self, code: int, reason: str, message: str,
                 details: JSON | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status: JSON = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                             "status": "Failure", "message": message, "reason": reason,
                             "code": code}
        if details:
            self.status["details"] = details


@dataclass(frozen=True)
class Kind:
    """One resource the stand-in serves."""

    kind: str       #: ``Job``
    group: str      #: ``batch`` ("" for the core group)
    version: str    #: ``v1``
    plural: str     #: ``jobs``

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``jobs.batch`` / ``pods``, as messages name a resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def kind_qualified(self) -> str:
        """``Job.batch`` / ``Secret``, as ``Invalid`` messages name a kind."""
        return f"{self.kind}.{self.group}" if self.group else self.kind


def not_found(kind: Kind, name: str) -> ApiFailure:
    return ApiFailure(404, "NotFound", f'{kind.qualified} "{name}" not found',
                      {"name": name, "group": kind.group, "kind": kind.plural})


def already_exists(kind: Kind, name: str) -> ApiFailure:
    return ApiFailure(409, "AlreadyExists", f'{kind.qualified} "{name}" already exists',
                      {"name": name, "group": kind.group, "kind": kind.plural})


def bad_request(message: str) -> ApiFailure:
    return ApiFailure(400, "BadRequest", message)


def forbidden(kind: Kind, verb: str, namespace: str, message: str | None) -> ApiFailure:
    text = message or (f'User "system:serviceaccount:{namespace}:ax-executor" cannot {verb} '
                       f'resource "{kind.plural}" in API group "{kind.group}" in the '
                       f'namespace "{namespace}"')
    return ApiFailure(403, "Forbidden", f"{kind.qualified} is forbidden: {text}",
                      {"group": kind.group, "kind": kind.plural})


def method_not_allowed(message: str) -> ApiFailure:
    return ApiFailure(405, "MethodNotAllowed", message)


def expired(requested: int, oldest: int) -> ApiFailure:
    """What a watch from a compacted resourceVersion gets (the watch cache's wording)."""
    return ApiFailure(410, "Expired", f"too old resource version: {requested} ({oldest})")


@dataclass(frozen=True)
class Cause:
    """One field error of an ``Invalid`` answer."""

    field: str
    message: str
    reason: str = "FieldValueInvalid"


def invalid(kind: Kind, name: str, causes: list[Cause]) -> ApiFailure:
    texts = [f"{c.field}: {c.message}" for c in causes]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    return ApiFailure(
        422, "Invalid", f'{kind.kind_qualified} "{name}" is invalid: {joined}',
        {"name": name, "group": kind.group, "kind": kind.kind,
         "causes": [{"reason": c.reason, "message": c.message, "field": c.field}
                    for c in causes]})


def bad_value(field: str, value: Any, why: str) -> Cause:
    return Cause(field, f"Invalid value: {json.dumps(value)}: {why}")


def required(field: str, why: str = "") -> Cause:
    return Cause(field, "Required value" + (f": {why}" if why else ""), "FieldValueRequired")


def unsupported(field: str, why: str) -> Cause:
    """A field the stand-in cannot simulate: refused loudly instead of run wrongly."""
    return Cause(field, f"Unsupported value: not supported by the Kubernetes stand-in: {why}",
                 "FieldValueNotSupported")


# --- names and labels ----------------------------------------------------------------------


def dns1123_subdomain(field: str, value: str) -> list[Cause]:
    if len(value) > 253:
        return [bad_value(field, value, "must be no more than 253 characters")]
    if not re.fullmatch(_DNS1123_SUBDOMAIN, value):
        return [bad_value(field, value,
                          "a lowercase RFC 1123 subdomain must consist of lower case "
                          "alphanumeric characters, '-' or '.', and must start and end with "
                          "an alphanumeric character (e.g. 'example.com', regex used for "
                          f"validation is '{_DNS1123_SUBDOMAIN}')")]
    return []


def dns1123_label(field: str, value: str) -> list[Cause]:
    if len(value) > 63:
        return [bad_value(field, value, "must be no more than 63 characters")]
    if not re.fullmatch(_DNS1123_LABEL, value):
        return [bad_value(field, value,
                          "a lowercase RFC 1123 label must consist of lower case alphanumeric "
                          "characters or '-', and must start and end with an alphanumeric "
                          f"character (e.g. 'my-name',  or '123-abc', regex used for "
                          f"validation is '{_DNS1123_LABEL}')")]
    return []


def qualified_name(field: str, key: str) -> list[Cause]:
    """A label or annotation key: an optional DNS subdomain prefix, ``/``, a name."""
    prefix, _, name = key.rpartition("/")
    causes = dns1123_subdomain(field, prefix) if "/" in key else []
    if not name or len(name) > 63 or not re.fullmatch(_QUALIFIED_NAME, name):
        causes.append(bad_value(field, key,
                                "name part must consist of alphanumeric characters, '-', '_' "
                                "or '.', and must start and end with an alphanumeric "
                                "character and be no more than 63 characters"))
    return causes


def label_value(field: str, value: str) -> list[Cause]:
    if len(value) > 63:
        return [bad_value(field, value, "must be no more than 63 characters")]
    if not re.fullmatch(_LABEL_VALUE, value):
        return [bad_value(field, value,
                          "a valid label must be an empty string or consist of alphanumeric "
                          "characters, '-', '_' or '.', and must start and end with an "
                          f"alphanumeric character (regex used for validation is "
                          f"'{_LABEL_VALUE}')")]
    return []


def metadata(field: str, meta: Mapping[str, Any]) -> list[Cause]:
    """Labels (keys and values) and annotation keys of an ``ObjectMeta``."""
    causes: list[Cause] = []
    for key, value in sorted((meta.get("labels") or {}).items()):
        causes += qualified_name(f"{field}.labels", key)
        causes += label_value(f"{field}.labels", value)
    for key in sorted(meta.get("annotations") or {}):
        causes += qualified_name(f"{field}.annotations", key)
    return causes


# --- selectors -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    """One term of a selector: ``key op values`` (``exists``/``!`` have no values)."""

    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values  # != and notin


def _split_terms(text: str) -> list[str]:
    terms, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return [t.strip() for t in terms if t.strip()]


def parse_label_selector(text: str) -> list[Requirement]:
    """Parse ``labelSelector`` (``a=b,c!=d,e in (f,g),h notin (i),j,!k``) or fail 400."""
    reqs = []
    for term in _split_terms(text):
        if m := re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term):
            values = tuple(v.strip() for v in m[3].split(",") if v.strip())
            req = Requirement(m[1], m[2], values)
        elif m := re.fullmatch(r"([^=!\s]+)\s*(==|=|!=)\s*(\S*)", term):
            req = Requirement(m[1], "!=" if m[2] == "!=" else "=", (m[3],))
        elif m := re.fullmatch(r"!\s*(\S+)", term):
            req = Requirement(m[1], "!")
        elif re.fullmatch(r"\S+", term):
            req = Requirement(term, "exists")
        else:
            raise bad_request(f"unable to parse requirement: {term!r}")
        if qualified_name("labelSelector", req.key) or any(
                label_value("labelSelector", v) for v in req.values):
            raise bad_request(f"unable to parse requirement: invalid label in {term!r}")
        reqs.append(req)
    return reqs


#: Field selectors each resource supports (a subset of the real ones).
FIELD_SELECTORS = {
    "jobs": ("metadata.name", "metadata.namespace", "status.successful"),
    "pods": ("metadata.name", "metadata.namespace", "spec.nodeName", "status.phase"),
    "secrets": ("metadata.name", "metadata.namespace", "type"),
}


def parse_field_selector(plural: str, text: str) -> list[Requirement]:
    reqs = []
    for term in _split_terms(text):
        m = re.fullmatch(r"([^=!\s]+)\s*(==|=|!=)\s*(\S*)", term)
        if not m:
            raise bad_request(f"invalid selector: {text!r}; can't understand {term!r}")
        supported = FIELD_SELECTORS[plural]
        if m[1] not in supported:
            raise bad_request(f'"{m[1]}" is not a known field selector: only '
                              + ", ".join(f'"{f}"' for f in supported))
        reqs.append(Requirement(m[1], "!=" if m[2] == "!=" else "=", (m[3],)))
    return reqs


def field_values(obj: JSON) -> dict[str, str]:
    """The selectable fields of an object, flattened (``status.successful`` is a count)."""
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    return {"metadata.name": meta["name"], "metadata.namespace": meta.get("namespace", ""),
            "status.successful": str(status.get("succeeded", 0)),
            "spec.nodeName": spec.get("nodeName", ""), "status.phase": status.get("phase", ""),
            "type": obj.get("type", "")}


def selected(obj: JSON, labels: Iterable[Requirement], fields: Iterable[Requirement]) -> bool:
    obj_labels = obj["metadata"].get("labels") or {}
    values = field_values(obj)
    return all(r.matches(obj_labels) for r in labels) and all(r.matches(values) for r in fields)


# --- strict schema -------------------------------------------------------------------------


@functools.cache
def _validator(kind: str, api_version: str) -> jsonschema.Draft202012Validator:
    """kubernetes_validate's strict schema for one kind, built once (its own ``validate``
    rebuilds the 1.8 MB definitions registry on every call)."""
    directory = f"kubernetes-json-schema/v{SCHEMA_VERSION}-local-strict"
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = kv.schema_contents(f"{directory}/{kind.lower()}-{group}.json", SCHEMA_VERSION)
    definitions = kv.schema_contents(f"{directory}/_definitions.json", SCHEMA_VERSION)
    registry: referencing.Registry[Any] = referencing.Registry().with_resources([
        (schema["$id"], referencing.Resource.from_contents(schema)),
        (definitions["$id"], referencing.Resource.from_contents(definitions)),
    ])
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _path(parts: Iterable[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text.lstrip(".")


def schema_errors(obj: JSON) -> list[Cause]:
    """Every violation of the strict v1.37 schema, unknown fields named in full.

    A real server (``fieldValidation`` unset, i.e. ``Warn``) drops unknown fields with a
    ``Warning`` header; the stand-in refuses them so a client's typo cannot pass unseen.
    """
    validator = _validator(obj["kind"], obj["apiVersion"])
    causes = []
    for error in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.path))):
        where = _path(error.path)
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            known = set(error.schema.get("properties", {}))
            for name in sorted(set(error.instance) - known):
                field = f"{where}.{name}" if where else name
                causes.append(Cause(field, f'unknown field "{field}"'))
        elif error.validator == "required" and isinstance(error.instance, dict):
            for name in error.validator_value:
                if name not in error.instance:
                    causes.append(required(f"{where}.{name}" if where else name))
        else:
            causes.append(Cause(where or "<root>", f"Invalid value: {error.message}"))
    return causes


def check_schema(obj: JSON) -> None:
    """Raise if an object the stand-in itself wrote breaks the schema (a stand-in bug)."""
    if causes := schema_errors(obj):
        raise AssertionError(f"stand-in wrote an invalid {obj['kind']}: {causes}")
