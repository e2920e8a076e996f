"""Writes the scalars TensorBoard reads from an event-file folder (argv[1]) to a JSON file
(argv[2]): {tag: [[step, value], ...]}.

Uses TensorBoard's own EventAccumulator (what the TensorBoard UI loads), so the test of loom's
event files checks the real reader: TFRecord framing, CRC-32C, protobuf records, and the purge
of steps a resumed run recomputed.
"""
import json
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main() -> None:
    accumulator = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
    accumulator.Reload()
    scalars = {
        tag: [[event.step, event.value] for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }
    with open(sys.argv[2], "w", encoding="utf-8") as out:
        json.dump(scalars, out)


if __name__ == "__main__":
    main()
