"""`python -m ppolab.rewrite_checkpoint OLD.pt NEW.pt`: a checkpoint saved in torch.save's legacy format, which holds
no checksums of its entries (the scripts refuse it: its bytes cannot be checked), rewritten as a checked copy, for a
file the user trusts. It is read as any checkpoint is (data only, its layout checked) and written as the scripts write
theirs."""

import sys

import torch

from ppolab.checkpoints import read_checkpoint, write_checkpoint_file


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m ppolab.rewrite_checkpoint OLD.pt NEW.pt", file=sys.stderr)
        return 2
    old, new = argv
    try:
        script = torch.load(old, map_location="cpu", weights_only=True).get("script")
    except Exception as e:  # noqa: BLE001 (read_checkpoint below says what the file is, in one line)
        script = f"{type(e).__name__}"
    checkpoint = read_checkpoint(old, str(script), unchecked=True)
    if isinstance(checkpoint, str):
        print(f"rewrite_checkpoint: error: {checkpoint}", file=sys.stderr)
        return 2
    try:
        write_checkpoint_file(checkpoint, new)
    except OSError as e:
        print(f"rewrite_checkpoint: error: cannot write {new}: {e.strerror}", file=sys.stderr)
        return 1
    print(f"{new}: a checked copy of {old}, for {script}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
