"""Test helper: read TensorBoard event files back (TFRecord framing + the Event proto that
tensorboardX ships), independently of the writer."""
import os
import struct


def read_events(logdir):
    """Scalars (tag -> [(step, value)]) of the TFRecord event files in logdir."""
    from tensorboardX.proto import event_pb2
    out = {}
    for name in sorted(os.listdir(logdir)):
        with open(os.path.join(logdir, name), "rb") as fh:
            data = fh.read()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for v in event.summary.value:
                out.setdefault(v.tag, []).append((event.step, v.simple_value))
    return out
