"""edgeloop's trainer-side client: read complete groups from the transfer queue, pad them, submit batches.

- :class:`Reader` (``Reader(url, prefix="edgeloop:")``): ``.groups(max, consumer, partition, block_ms)``
  returns complete :class:`Group` objects whose records hold numpy arrays; ``.ack(groups)``.
- :func:`to_padded` (``to_padded(groups, pad_token_id)``): the verl ``DataProto`` batch as numpy arrays.
- :func:`submit` (``submit(url, rows, config=None, token=None)``): ``POST /v1/rollouts``.
- :func:`tree_nodes` / :func:`resolve_tree`: a group's branch records as trajectory-tree nodes (their own tokens only) and back.
- :func:`decode_record`: one stored record hash → record dict (the layout of docs/queue-layout.md).
- :func:`image_inputs`: a record's images (grids, pad-token spans, bytes when inline), checked against its ids.
- :mod:`edgeloop.blobs` (``Reader(..., blobs="file:///dir" | "s3://bucket/prefix")``): where records' large
  parts (routed experts above the writer's threshold) are fetched from, checked against their SHA-256.
"""

from .blobs import BlobError, BlobIntegrityError, FileBlobs, S3Blobs, open_blobs
from .http import EdgeloopHTTPError, submit
from .images import image_inputs
from .layout import LayoutError, decode_record, record_to_json
from .padding import to_padded
from .reader import Group, Reader, read_all
from .tree import resolve_tree, tree_nodes

__version__ = "0.1.0"
__all__ = [
    "Reader",
    "Group",
    "read_all",
    "to_padded",
    "submit",
    "decode_record",
    "image_inputs",
    "record_to_json",
    "LayoutError",
    "EdgeloopHTTPError",
    "tree_nodes",
    "resolve_tree",
    "BlobError",
    "BlobIntegrityError",
    "FileBlobs",
    "S3Blobs",
    "open_blobs",
]
