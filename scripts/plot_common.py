"""What the plotting scripts share: one-line errors (exit status 2), the --out check, matplotlib
with the Agg backend, and the save."""
import os
import sys


def reporter(prog):
    """die(msg): 'PROG: error: msg' on stderr, exit status 2; warn(msg): 'PROG: warning: msg'."""
    def die(msg):
        print(f"{prog}: error: {msg}", file=sys.stderr)
        sys.exit(2)

    def warn(msg):
        print(f"{prog}: warning: {msg}", file=sys.stderr)

    return die, warn


def check_out(path, die):
    if os.path.splitext(path)[1].lower() not in (".png", ".svg"):
        die(f"--out {path}: unknown extension (use .png or .svg)")


def pyplot(die):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        die("matplotlib is not installed (Debian: apt-get install python3-matplotlib, then run with /usr/bin/python3)")
    return plt


def save(fig, path, die):
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=150)
    except OSError as e:
        die(f"cannot write {path}: {e.strerror or e}")
    print(f"wrote {path}")
