"""Reading complete groups from the transfer queue (docs/queue-layout.md, "Reads").

The second implementation of the layout's read side (the first is
``readCompleteGroups`` in ``shared/store/redis-transfer-queue.ts``): one
consumer group (default ``trainers``) per partition stream
``{prefix}groups:{partition}``; entries left unacked longer than the
visibility timeout are claimed again (``XAUTOCLAIM``), then new entries are
read (``XREADGROUP ... >``), then every record hash is fetched in one pipeline.
"""

import binascii
import json
from dataclasses import dataclass, field
from typing import List

import redis

from .blobs import open_blobs
from .layout import LayoutError, decode_record, key_part
from .tree import tree_nodes

__all__ = ["Group", "Reader", "read_all"]

#: Consumer group trainers read with (``DEFAULT_GROUP`` of the TypeScript queue).
DEFAULT_GROUP = "trainers"
#: Milliseconds a delivered group may stay unacked before another consumer claims it (the TypeScript default).
DEFAULT_VISIBILITY_TIMEOUT_MS = 300_000


@dataclass
class Group:
    """One complete prompt group, as delivered once to one consumer.

    - ``uid``: the prompt group's id;
    - ``partition``: ``"train"`` or ``"val"``;
    - ``delivery_id``: the stream entry id (``<ms>-<seq>``), what :meth:`Reader.ack` acknowledges;
    - ``n``: sessions the group expected (the entry's ``n``);
    - ``failed``: how many of ``records`` have ``error`` set;
    - ``records``: every record of the group ordered by ``session_id`` then
      ``output_index`` (see :func:`edgeloop.layout.decode_record` for a record's fields and dtypes);
      a record whose hash has expired is left out.
    """

    uid: str
    partition: str
    delivery_id: str
    n: int
    failed: int
    records: List[dict] = field(default_factory=list)


def _text(v):
    return v.decode("utf-8") if isinstance(v, (bytes, bytearray)) else v


def _group_gone(e):
    # NOGROUP: stream or consumer group missing; UNBLOCKED: a blocked read whose stream was deleted.
    s = str(e)
    return s.startswith("NOGROUP") or s.startswith("UNBLOCKED") or " NOGROUP " in s


max_ = max


def crc16(data):
    """CRC16-XMODEM, Redis Cluster's key hash (``binascii.crc_hqx(data, 0)``)."""
    return binascii.crc_hqx(data, 0)


def shard_of(uid, shards):
    """The stream shard of a group: ``CRC16(uid UTF-8) mod shards`` (0 for one shard), as the TypeScript store."""
    return 0 if shards <= 1 else crc16(uid.encode("utf-8")) % shards


_TAGS = {}


def shard_tags(shards):
    """Hash tags of the ``shards`` stream shards (``shardTags`` in shared/store/key-slot.ts): shard k's is the
    first of ``s{k}``, ``s{k}.1``, … whose slot lies in the middle half of the k-th of ``shards`` equal slot ranges."""
    if shards in _TAGS:
        return _TAGS[shards]
    tags = []
    for k in range(shards):
        lo, w = k * 16384 / shards, 16384 / shards
        j = 0
        while True:
            tag = f"s{k}" if j == 0 else f"s{k}.{j}"
            slot = crc16(tag.encode()) % 16384
            if lo + w / 4 <= slot < lo + 3 * w / 4:
                tags.append(tag)
                break
            j += 1
    _TAGS[shards] = tags
    return tags


def _cluster_client(url):
    """A redis-py ``RedisCluster`` for ``redis+cluster://[user:pass@]host:port[,host:port…]``."""
    from urllib.parse import unquote
    from redis.cluster import ClusterNode, RedisCluster
    scheme, rest = url.split("://", 1)
    auth, _, hosts = rest.rpartition("@")
    kw = {}
    if auth:
        user, sep, pw = auth.partition(":")
        if sep:
            if user:
                kw["username"] = unquote(user)
            kw["password"] = unquote(pw)
        else:
            kw["password"] = unquote(user)
    nodes = []
    for hp in hosts.rstrip("/").split(","):
        h, _, p = hp.rpartition(":")
        nodes.append(ClusterNode(h or hp, int(p) if h else 6379))
    return RedisCluster(startup_nodes=nodes, ssl=scheme.startswith("rediss"), **kw)


class Reader:
    """Reads complete groups from an edgeloop transfer queue in Redis.

    ``url``: a Redis URL (``redis://[:password@]host:port[/db]``, ``rediss://`` for TLS)
    — the same database the edgeloop store writes, over TCP or through Upstash
    (Upstash databases also speak the Redis protocol).
    ``prefix``: the store's key prefix (``store.prefix`` / ``--store-prefix``, default ``edgeloop:``).
    ``group``: the consumer group (default ``trainers``).
    ``visibility_timeout_ms``: how long a delivered, unacked group stays with
    its consumer before any consumer may claim it again (default 300 000).
    ``client``: an existing ``redis.Redis`` to use instead of ``url`` (it must
    not set ``decode_responses``).
    ``blobs``: the blob store the writer keeps large record parts in (its
    ``--blob-store``): ``file:///dir``, ``s3://bucket/prefix`` (AWS environment
    for endpoint/region/credentials) or an object with ``get(key)``; see
    :mod:`edgeloop.blobs`. Every blob is checked against its record's SHA-256;
    a record whose blob is missing or differs comes back with ``error`` set
    (naming the key and field), the rest of its group as usual.

    Delivery is at least once: a group is delivered again if it is not acked
    within the visibility timeout, or if Redis lost the consumer group (it is
    recreated at id 0, as the TypeScript reader does). Dedupe on ``uid``.
    """

    def __init__(self, url="redis://127.0.0.1:6379", prefix="edgeloop:", group=DEFAULT_GROUP,
                 visibility_timeout_ms=DEFAULT_VISIBILITY_TIMEOUT_MS, client=None, shards=1, tagged=None, blobs=None):
        cluster = url.startswith(("redis+cluster://", "rediss+cluster://"))
        if client is not None:
            self.redis = client
            cluster = cluster or type(client).__name__ == "RedisCluster"
        elif cluster:
            self.redis = _cluster_client(url)
        else:
            self.redis = redis.Redis.from_url(url)
        if not isinstance(shards, int) or shards < 1 or shards > 1024:
            raise ValueError(f"shards must be an integer in 1..1024, got {shards!r}")
        self.blobs = open_blobs(blobs)
        self.prefix = prefix
        self.group = group
        self.shards = shards
        self.tagged = (cluster or shards > 1) if tagged is None else bool(tagged)
        self._tags = shard_tags(shards)
        self.visibility_timeout_ms = int(visibility_timeout_ms)
        self._ensured = set()
        self._next_shard = 0

    def base(self, shard=0):
        """The key prefix of shard ``shard``: ``prefix`` untagged, else ``prefix + "{tag}:"``."""
        return f"{self.prefix}{{{self._tags[shard]}}}:" if self.tagged else self.prefix

    def stream(self, partition="train", shard=0):
        """The partition's stream key of one shard, ``{prefix}groups:{partition}`` (tagged: ``{prefix}{tag}:groups:{partition}``)."""
        if partition not in ("train", "val"):
            raise ValueError(f"partition must be 'train' or 'val', got {partition!r}")
        return f"{self.base(shard)}groups:{partition}"

    def _ensure(self, stream):
        if stream in self._ensured:
            return
        try:
            self.redis.xgroup_create(stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise
        self._ensured.add(stream)

    def _with_group(self, stream, fn):
        self._ensure(stream)
        try:
            return fn()
        except redis.ResponseError as e:
            if not _group_gone(e):
                raise
            self._ensured.discard(stream)
            self._ensure(stream)
            return fn()

    def groups(self, max=16, consumer="trainer-0", partition="train", block_ms=1000, agent_role=None, deliver="leaves"):
        """Up to ``max`` complete groups for ``consumer``, as a list of :class:`Group`.

        First claims groups other consumers left unacked longer than the
        visibility timeout, then reads new ones, waiting up to ``block_ms``
        milliseconds when none are ready (0: do not wait). Returns ``[]`` when
        none arrived in time. Each group stays pending for this consumer until
        :meth:`ack`. ``agent_role``: keep only the records whose
        ``agent_role`` is this one in each group (``failed`` counted over
        them; a group with none is still delivered, with ``records == []``, to
        be acked); give each role's trainer its own ``group`` so that each
        sees every group (docs/queue-layout.md, "Per agent role").
        ``deliver``: ``"leaves"`` (default), every record whole as stored;
        ``"tree"``, a branch of a trajectory tree whose parent is in the same
        group holds only its tokens from ``branch_at`` on, with
        ``tree_prompt_length`` set (:mod:`edgeloop.tree`; ``resolve_tree``
        gives the whole records back), applied after ``agent_role``. Raises ``ValueError`` for bad arguments,
        :class:`~edgeloop.layout.LayoutError` for stored data that does not
        follow the layout, and redis-py's errors for connection failures.
        """
        if not isinstance(max, int) or max < 1:
            raise ValueError(f"max must be an integer >= 1, got {max!r}")
        if not isinstance(block_ms, int) or block_ms < 0:
            raise ValueError(f"block_ms must be an integer >= 0, got {block_ms!r}")
        if not consumer:
            raise ValueError("consumer must be a non-empty string")
        if agent_role is not None and (not isinstance(agent_role, str) or not agent_role):
            raise ValueError(f"agent_role must be a non-empty string or None, got {agent_role!r}")
        if deliver not in ("leaves", "tree"):
            raise ValueError(f"deliver must be 'leaves' or 'tree', got {deliver!r}")
        if self.shards == 1:
            stream = self.stream(partition)
            entries = self._with_group(stream, lambda: self._autoclaim(stream, consumer, max))
            if len(entries) < max:
                wait = block_ms if not entries else 0
                entries += self._with_group(stream, lambda: self._read(stream, consumer, max - len(entries), wait))
            entries = [(0, i, f) for i, f in entries]
        else:
            entries = self._read_shards(partition, consumer, max, block_ms)
        groups = self._materialise(partition, entries, agent_role)
        if deliver == "tree":
            for g in groups:
                g.records = tree_nodes(g.records)
        return groups

    def _read_shards(self, partition, consumer, max, block_ms):
        # Every shard from a rotating start: stale entries, then new ones without blocking; with none, each shard
        # is waited on in turn for an equal part of block_ms (redis-py has no concurrent blocking reads here).
        n = self.shards
        start = self._next_shard % n
        self._next_shard += 1
        order = [(start + i) % n for i in range(n)]
        out = []
        for k in order:
            if len(out) >= max:
                break
            st = self.stream(partition, k)
            out += [(k, i, f) for i, f in self._with_group(st, lambda: self._autoclaim(st, consumer, max - len(out)))]
        for k in order:
            if len(out) >= max:
                break
            st = self.stream(partition, k)
            out += [(k, i, f) for i, f in self._with_group(st, lambda: self._read(st, consumer, max - len(out), 0))]
        if out or block_ms <= 0:
            return out
        part_ms = max_(1, block_ms // n)
        for k in order:
            st = self.stream(partition, k)
            out += [(k, i, f) for i, f in self._with_group(st, lambda: self._read(st, consumer, max, part_ms))]
            if out:
                break
        return out

    def _autoclaim(self, stream, consumer, max, rounds=8):
        out, cursor = [], "0-0"
        for _ in range(rounds):
            r = self.redis.xautoclaim(stream, self.group, consumer, self.visibility_timeout_ms, start_id=cursor, count=max - len(out))
            out += [(i, f) for i, f in (r[1] or []) if i is not None and f is not None]
            cursor = _text(r[0])
            if cursor == "0-0" or len(out) >= max:
                break
        return out

    def _read(self, stream, consumer, count, block_ms):
        r = self.redis.xreadgroup(self.group, consumer, {stream: ">"}, count=count, block=block_ms or None)
        out = []
        for _name, entries in r or []:
            out += [(i, f) for i, f in entries if f is not None]
        return out

    def _materialise(self, partition, entries, agent_role=None):
        groups = []
        for shard, entry_id, f in entries:
            eid = _text(entry_id)
            if self.shards > 1:
                eid = f"{eid}@{shard}"
            f = {_text(k): _text(v) for k, v in f.items()}
            try:
                keys = json.loads(f.get("keys") or "[]")
            except ValueError:
                raise LayoutError("stream entry has a bad keys field", eid, "keys") from None
            if not isinstance(keys, list):
                raise LayoutError("stream entry keys is not a JSON array", eid, "keys")
            groups.append((eid, f, keys, self.base(shard)))
        pipe = self.redis.pipeline(transaction=False) if type(self.redis).__name__ != "RedisCluster" else self.redis.pipeline()
        for _eid, _f, keys, base in groups:
            for k in keys:
                pipe.hgetall(f"{base}traj:{key_part(k)}")
        replies = pipe.execute() if any(keys for _e, _f, keys, _b in groups) else []
        out, i = [], 0
        for eid, f, keys, _b in groups:
            records = []
            for k in keys:
                h = replies[i]
                i += 1
                if h:
                    rec = decode_record(h, k, blobs=self.blobs, blob_errors="mark")
                    if agent_role is None or rec.get("agent_role") == agent_role:
                        records.append(rec)
            out.append(Group(
                uid=f.get("uid", ""),
                partition=partition,
                delivery_id=eid,
                n=int(f.get("n") or 0),
                failed=sum(1 for r in records if r.get("error") is not None),
                records=records,
            ))
        return out

    def ack(self, groups, partition=None):
        """Acknowledges delivered groups; returns how many were pending.

        ``groups``: :class:`Group` objects (each acked in its own partition) or
        delivery id strings (acked in ``partition``, default ``"train"``). An
        acked group is never delivered again.
        """
        if isinstance(groups, (Group, str, bytes)):
            groups = [groups]
        by_part = {}
        for g in groups:
            if isinstance(g, Group):
                by_part.setdefault(partition or g.partition, []).append(g.delivery_id)
            else:
                by_part.setdefault(partition or "train", []).append(_text(g))
        acked = 0
        for part, ids in by_part.items():
            by_shard = {}
            for d in ids:
                if self.shards > 1:
                    eid, _, k = d.partition("@")
                    if not k.isdigit() or int(k) >= self.shards:
                        raise ValueError(f"{d!r} is not a delivery id of this {self.shards}-shard queue (expected <ms>-<seq>@<shard>)")
                    by_shard.setdefault(int(k), []).append(eid)
                else:
                    by_shard.setdefault(0, []).append(d)
            for k, sids in by_shard.items():
                acked += int(self.redis.xack(self.stream(part, k), self.group, *sids))
        return acked

    def close(self):
        """Closes the connection pool."""
        self.redis.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_all(reader, consumer="trainer-0", partition="train", max=64, block_ms=0) -> List[Group]:
    """Every group currently readable (repeated :meth:`Reader.groups` until one returns none); does not ack."""
    out: List[Group] = []
    while True:
        got = reader.groups(max=max, consumer=consumer, partition=partition, block_ms=block_ms)
        if not got:
            return out
        out += got
        block_ms = 0

