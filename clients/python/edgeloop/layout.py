"""Decoding of the transfer queue's stored records (docs/queue-layout.md, "Record hash").

A record is one Redis HASH ``{prefix}traj:{key}`` whose fields are:

- ``meta``: UTF-8 JSON of every scalar/object field (``key, uid, session_id,
  output_index, agent_name, data_source, reward_score, num_turns, truncated,
  finish_reason, error, metrics, extra_fields``, and ``parent_key,
  branch_at`` for records of trajectory trees: the key of the record this one
  branched from and the token index into its ``prompt_ids + response_ids``
  where it branches, both ``None`` for a root; absent in other records, where
  ``rec.get("parent_key")`` is ``None`` too);
- ``prompt_ids`` / ``response_ids``: base64 of little-endian int32 token ids;
- ``response_mask``: base64 of one uint8 (0/1) per response token;
- ``rollout_log_probs``: base64 of little-endian float32, one per response
  token; absent when log-probs were not requested;
- ``teacher_log_probs``: base64 of little-endian float32, one per response
  token (the teacher's log-prob of each sampled token); absent when no teacher
  was configured;
- ``routed_experts``: base64 of the expert ids of shape
  ``[len(prompt_ids) + len(response_ids), layers, top_k]`` in row-major order,
  packed as ``routed_experts_dtype`` says: ``uint8`` (every id <= 254),
  ``uint16`` (little-endian, every id <= 65,534) or ``int32`` (little-endian);
  in the unsigned widths the all-ones code (255, 65,535) stands for -1; absent
  (records of older versions) means int32. ``routed_experts_shape`` = JSON
  ``[layers, top_k]``. All three are absent when routed experts were not
  requested;
- ``routed_experts_blob``: in place of ``routed_experts`` when they were
  larger than the writer's blob threshold: JSON ``{"key", "sha256", "bytes"}``
  of the blob holding the packed bytes (``routed_experts_dtype`` and
  ``routed_experts_shape`` stored as usual). :func:`decode_record` given a
  blob store (:mod:`edgeloop.blobs`) fetches it, checks its byte count and
  SHA-256, and decodes it as if it were inline.

This module is runtime-independent of Redis: it turns such a hash (a mapping
of ``bytes`` or ``str`` to ``bytes`` or ``str``, as redis-py returns it) into
a record ``dict`` whose arrays are numpy arrays.
"""

import base64
import binascii
import json
import re

import numpy as np

from .keys import key_part

__all__ = [
    "LayoutError",
    "ARRAY_FIELDS",
    "decode_record",
    "record_to_json",
    "key_part",
]

#: Stored array fields and their little-endian dtypes.
ARRAY_FIELDS = {
    "prompt_ids": "<i4",
    "response_ids": "<i4",
    "response_mask": "u1",
    "rollout_log_probs": "<f4",
    "teacher_log_probs": "<f4",
    "routed_experts": "<i4",
}

#: ``routed_experts_dtype`` values and their stored little-endian dtypes (absent: int32).
ROUTED_EXPERTS_DTYPES = {"uint8": "u1", "uint16": "<u2", "int32": "<i4"}

# Native dtypes the arrays are returned in (the stored bytes, converted from little-endian when the host is not).
_NATIVE = {"<i4": np.int32, "u1": np.uint8, "<f4": np.float32}


class LayoutError(ValueError):
    """A stored record or stream entry that does not follow docs/queue-layout.md.

    Attributes: ``key`` (the trajectory key or stream entry id, when known) and
    ``field`` (the hash/entry field at fault, when known).
    """

    def __init__(self, message, key=None, field=None):
        where = ", ".join(x for x in (f"key {key}" if key else "", f"field {field}" if field else "") if x)
        super().__init__(f"{message} ({where})" if where else message)
        self.key = key
        self.field = field


def _text(v):
    return v.decode("utf-8") if isinstance(v, (bytes, bytearray)) else v


def _fields(h):
    """A hash as ``{str: bytes|str}`` (redis-py returns bytes keys unless ``decode_responses``)."""
    return {_text(k): v for k, v in h.items()}


def _array(fields, name, key, dt=None):
    raw = fields.get(name)
    if raw is None:
        return None
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as e:
        raise LayoutError(f"stored {name} is not valid base64: {e}", key, name) from None
    dt = dt or ARRAY_FIELDS[name]
    if dt in ("u1", "<u2") and name == "routed_experts":
        size = np.dtype(dt).itemsize
        if len(data) % size:
            raise LayoutError(f"stored {name} has {len(data)} bytes, not a multiple of {size}", key, name)
        packed = np.frombuffer(data, dtype=dt)
        out = packed.astype(np.int32)
        # The all-ones code of the unsigned width is -1 (docs/queue-layout.md).
        out[packed == np.iinfo(packed.dtype).max] = -1
        return out
    size = np.dtype(dt).itemsize
    if len(data) % size:
        raise LayoutError(f"stored {name} has {len(data)} bytes, not a multiple of {size}", key, name)
    # astype copies into a writable, native-endian array (frombuffer over bytes is read-only).
    return np.frombuffer(data, dtype=dt).astype(_NATIVE[dt])


def decode_record(h, key=None, blobs=None, blob_errors="raise"):
    """Decodes one stored record hash into a record ``dict``.

    ``blobs``: the blob store (:func:`edgeloop.blobs.open_blobs`: a ``file://`` or ``s3://`` URL or an
    object with ``get(key)``) records holding ``routed_experts_blob`` are read from; a record that holds
    one while ``blobs`` is ``None`` raises :class:`LayoutError` naming the field. ``blob_errors``:
    ``"raise"`` (default) raises :class:`edgeloop.blobs.BlobIntegrityError` for a blob that is missing
    or whose bytes differ from the pointer; ``"mark"`` returns the record with ``error`` set to that
    message, ``routed_experts`` ``None`` and the pointer under ``routed_experts_blob`` (what
    :meth:`edgeloop.Reader.groups` does: one bad blob fails its record, not the batch).

    ``h``: the ``HGETALL {prefix}traj:{key}`` reply (bytes or str keys/values).
    Returns a dict with every ``meta`` field plus:

    - ``prompt_ids``: int32 ``[P]``; ``response_ids``: int32 ``[R]``;
    - ``response_mask``: uint8 ``[R]`` (1 = sampled by the model, 0 = tool/observation);
    - ``rollout_log_probs``: float32 ``[R]`` or ``None`` (field absent);
    - ``teacher_log_probs``: float32 ``[R]`` or ``None`` (field absent);
    - ``routed_experts``: int32 ``[P + R, layers, top_k]`` or ``None`` (field absent),
      whatever width it was stored in (``routed_experts_dtype``; -1 kept).

    Float32 values are the stored bits (no rounding through float64 text).
    Raises :class:`LayoutError` naming the key and field when the hash has no
    ``meta``, a field is not base64 of whole elements, or lengths disagree.
    """
    f = _fields(h)
    if "meta" not in f:
        raise LayoutError("stored record has no meta field", key, "meta")
    try:
        rec = json.loads(_text(f["meta"]))
    except ValueError as e:
        raise LayoutError(f"stored meta is not JSON: {e}", key, "meta") from None
    if not isinstance(rec, dict):
        raise LayoutError("stored meta is not a JSON object", key, "meta")
    key = rec.get("key", key)
    for name in ("prompt_ids", "response_ids", "response_mask"):
        a = _array(f, name, key)
        rec[name] = a if a is not None else np.zeros(0, dtype=_NATIVE[ARRAY_FIELDS[name]])
    n = rec["response_ids"].shape[0]
    for name in ("response_mask", "rollout_log_probs", "teacher_log_probs"):
        a = rec[name] if name == "response_mask" else _array(f, name, key)
        if a is not None and a.shape[0] != n:
            raise LayoutError(f"{name} has {a.shape[0]} entries, response_ids has {n}", key, name)
        rec[name] = a
    dtype = f.get("routed_experts_dtype")
    dtype = "int32" if dtype is None else _text(dtype)
    if dtype not in ROUTED_EXPERTS_DTYPES:
        raise LayoutError(f"routed_experts_dtype must be uint8, uint16 or int32, got {dtype!r}", key, "routed_experts_dtype")
    experts = _array(f, "routed_experts", key, ROUTED_EXPERTS_DTYPES[dtype])
    if f.get("routed_experts_blob") is not None:
        if experts is not None:
            raise LayoutError("stored record has both routed_experts and routed_experts_blob", key, "routed_experts_blob")
        try:
            experts = _blob_array(f, key, dtype, blobs)
        except LayoutError as e:
            from .blobs import BlobIntegrityError

            if blob_errors != "mark" or not isinstance(e, BlobIntegrityError):
                raise
            rec["error"] = str(e)
            rec["routed_experts_blob"] = json.loads(_text(f["routed_experts_blob"]))
    if experts is not None:
        shape = f.get("routed_experts_shape")
        try:
            layers, top_k = (int(x) for x in json.loads(_text(shape)))
        except (TypeError, ValueError) as e:
            raise LayoutError(f"routed_experts_shape must be JSON [layers, top_k], got {shape!r}: {e}", key, "routed_experts_shape") from None
        tokens = rec["prompt_ids"].shape[0] + n
        if layers <= 0 or top_k <= 0 or experts.size != tokens * layers * top_k:
            raise LayoutError(
                f"routed_experts has {experts.size} values, not {tokens} tokens x {layers} layers x {top_k} top_k", key, "routed_experts"
            )
        experts = experts.reshape(tokens, layers, top_k)
    rec["routed_experts"] = experts
    return rec


def _blob_array(f, key, dtype, blobs):
    """The routed experts of a record holding ``routed_experts_blob``, fetched from ``blobs`` and checked."""
    from .blobs import fetch_verified, open_blobs

    raw = _text(f["routed_experts_blob"])
    try:
        ptr = json.loads(raw)
        ok = isinstance(ptr, dict) and isinstance(ptr.get("key"), str) and isinstance(ptr.get("bytes"), int) and re.match(r"^[0-9a-f]{64}$", str(ptr.get("sha256")))
    except ValueError:
        ok = False
    if not ok:
        raise LayoutError(f"routed_experts_blob must be JSON {{key, sha256, bytes}}, got {raw[:120]!r}", key, "routed_experts_blob")
    if blobs is None:
        raise LayoutError("the record keeps routed_experts in a blob store: pass Reader(blobs='file:///dir' or 's3://bucket/prefix') as the writer's --blob-store", key, "routed_experts_blob")
    data = fetch_verified(open_blobs(blobs), ptr, key, "routed_experts")
    dt = ROUTED_EXPERTS_DTYPES[dtype]
    size = np.dtype(dt).itemsize
    if len(data) % size:
        raise LayoutError(f"blob of routed_experts has {len(data)} bytes, not a multiple of {size}", key, "routed_experts")
    packed = np.frombuffer(data, dtype=dt)
    if dt in ("u1", "<u2"):
        out = packed.astype(np.int32)
        out[packed == np.iinfo(packed.dtype).max] = -1
        return out
    return packed.astype(np.int32)


def record_to_json(rec):
    """A record ``dict`` as plain JSON values (arrays as lists; float32 values as the Python floats they are exactly).

    ``json.dumps(record_to_json(rec))`` parses back to the same values as the
    CLI's JSONL line of that record (``edgeloop rollout --out``), plus
    ``teacher_log_probs``/``routed_experts`` when they were stored.
    """
    out = {}
    for k, v in rec.items():
        out[k] = v.tolist() if isinstance(v, np.ndarray) else v
    return out
