"""Writes `digits_infer.json`, the job the Node.js client submits (`python digits_infer.py`).

A client outside Python cannot capture a torch model, so the job travels as a whole `JobSpec`
in the proto3 JSON mapping, made here once by the Python job API (the model captured for
alice's rows of 64 pixels): bob's private digits model on
alice's images, predictions revealed to alice only. tests/examples/test_node_client.py checks
that the committed file is still what this script writes.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import json_format

from mpcml.api.job import Job
from mpcml.demo import models

SPEC_FILE = Path(__file__).resolve().parent / "digits_infer.json"


def spec_json() -> str:
    """The job's `JobSpec` as proto3 JSON (lowerCamelCase names, as proto-loader reads them).

    Keys are sorted: protobuf iterates map fields (a node's `attrs`) in no fixed order.
    """
    job = Job.infer(
        model=models.DigitsMLP(),
        weights={"bob": "digits-mlp"},
        features={"alice": "digits-test"},
        reveal={"predictions": ["alice"]},
        name="digits-node-example",
        input_shape=(64,),
    )
    return json_format.MessageToJson(job.spec, indent=2, sort_keys=True) + "\n"


def main() -> None:
    """Write the spec next to this script."""
    SPEC_FILE.write_text(spec_json())
    print(f"wrote {SPEC_FILE}")


if __name__ == "__main__":
    main()
