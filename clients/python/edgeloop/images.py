"""The images of a record (field ``multi_modal``, docs/queue-layout.md): what a trainer needs to rebuild vision inputs.

A record of a vision-language model (``qwen3_vl``) holds in ``meta`` a
``multi_modal`` object: the processor settings its placeholder counts came
from, the placeholder token ids, and per image its ``sha256``, ``mime``,
``bytes``, stored ``width``/``height``, ``image_grid_thw`` ``[t, h, w]``,
``span`` ``[start, end)`` of its ``<|image_pad|>`` run in
``prompt_ids + response_ids`` (``<|vision_start|>`` at ``start - 1``,
``<|vision_end|>`` at ``end``), ``source`` (``prompt`` or ``tool``), ``field``
and, for images up to 64 KiB, ``data`` (base64 of the file).
"""

import base64

import numpy as np

from .layout import LayoutError

__all__ = ["image_inputs"]


def image_inputs(rec):
    """The vision inputs of one decoded record (``decode_record``), checked against its ids.

    Returns ``None`` for a record without images, else a dict:

    - ``image_grid_thw``: int64 ``[N, 3]`` (what the model's processor computes
      again from the bytes: ``pixel_values`` has ``t*h*w`` rows per image);
    - ``image_spans``: int64 ``[N, 2]``, ``[start, end)`` in ``input_ids = prompt_ids + response_ids``;
    - ``images``: per image ``{sha256, mime, width, height, source, field, data}``
      with ``data`` the file's bytes when stored inline, else ``None`` (fetch it
      by ``sha256`` from where the row or the blob store keeps it);
    - ``image_token_id``, ``vision_start_id``, ``vision_end_id``, ``processor`` (settings).

    Raises :class:`LayoutError` (field ``multi_modal``) when a span does not
    hold exactly ``t*h*w / merge_size**2`` image tokens between the vision
    start and end ids, or inline data does not match ``bytes``.
    """
    mm = rec.get("multi_modal")
    if mm is None:
        return None
    key = rec.get("key")
    ids = np.concatenate([rec["prompt_ids"], rec["response_ids"]]).astype(np.int64)
    merge2 = int(mm["processor"]["merge_size"]) ** 2
    grids = np.array([img["image_grid_thw"] for img in mm["images"]], dtype=np.int64).reshape(-1, 3)
    spans = np.array([img["span"] for img in mm["images"]], dtype=np.int64).reshape(-1, 2)
    images = []
    for i, img in enumerate(mm["images"]):
        s, e = int(spans[i, 0]), int(spans[i, 1])
        want = int(np.prod(grids[i])) // merge2
        if not (1 <= s <= e < ids.shape[0]) or e - s != want:
            raise LayoutError(f"image {i}: span [{s}, {e}) does not hold the {want} tokens of grid {grids[i].tolist()}", key, "multi_modal")
        if ids[s - 1] != mm["vision_start_id"] or ids[e] != mm["vision_end_id"] or not np.all(ids[s:e] == mm["image_token_id"]):
            raise LayoutError(f"image {i}: ids at span [{s}, {e}) are not vision_start, image tokens, vision_end", key, "multi_modal")
        data = base64.b64decode(img["data"]) if img.get("data") is not None else None
        if data is not None and len(data) != img["bytes"]:
            raise LayoutError(f"image {i}: inline data has {len(data)} bytes, the record says {img['bytes']}", key, "multi_modal")
        entry = {k: img.get(k) for k in ("sha256", "mime", "width", "height", "source", "field")}
        entry["data"] = data
        images.append(entry)
    return {
        "image_grid_thw": grids,
        "image_spans": spans,
        "images": images,
        "image_token_id": mm["image_token_id"],
        "vision_start_id": mm["vision_start_id"],
        "vision_end_id": mm["vision_end_id"],
        "processor": mm["processor"],
    }
