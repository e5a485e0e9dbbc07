"""Redis key names built from user-supplied parts (docs/queue-layout.md, "Keys"); standard library only."""

from urllib.parse import quote

__all__ = ["key_part"]


def key_part(value):
    """One user-supplied component of a Redis key (a uid, a trajectory key) as it appears in key names.

    The same encoding as ``keyPart`` in ``shared/store/key-encoding.ts``: unchanged when it holds only
    ``[A-Za-z0-9._~-]`` (every uid and key the API accepts), otherwise each UTF-8 byte outside that set
    as ``%XX``. ``{prefix}traj:{key}`` is ``prefix + "traj:" + key_part(key)``.
    Raises ``ValueError`` for an empty or non-string part.
    """
    if not isinstance(value, str) or not value:
        raise ValueError("a key part must be a non-empty string")
    return quote(value, safe="")
