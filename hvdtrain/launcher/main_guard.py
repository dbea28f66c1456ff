"""`launch()` at a script's top level without `if __name__ == "__main__":`, caught before anything starts.

Horovod's runner starts its helper processes with multiprocessing's spawn method, which re-imports
the main script in each of them; an unguarded launch() there starts the job again from every helper
and prints dozens of "bootstrapping phase" errors instead of one line saying what to add.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import FrameType


def _is_main_test(test: ast.expr) -> bool:
    text = ast.unparse(test).replace("'", '"')
    return text in ('__name__ == "__main__"', '"__main__" == __name__')


def unguarded_line(source: str, line: int) -> bool:
    """True when `line` of a script's `source` belongs to a top-level statement outside the main guard.

    Example:
        >>> unguarded_line("import x\\nx.launch()\\n", 2), unguarded_line("if __name__ == '__main__':\\n    go()\\n", 2)
        (True, False)
    """
    for statement in ast.parse(source).body:
        if statement.lineno <= line <= (statement.end_lineno or statement.lineno):
            return not (isinstance(statement, ast.If) and _is_main_test(statement.test))
    return False


def script_frame(frame: FrameType | None) -> FrameType | None:
    """The main script's top-level frame on the stack, if the caller runs inside one."""
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__":
            return frame
        frame = frame.f_back
    return None


def check_main_guard(caller: str) -> None:
    """Exit with one line (before any worker starts) when `caller` runs unguarded at a script's top level."""
    frame = script_frame(sys._getframe(1))
    if frame is None:
        return
    path = Path(frame.f_code.co_filename)
    if path.suffix != ".py" or not path.is_file():    # a notebook cell, stdin, `python -c`
        return
    try:
        unguarded = unguarded_line(path.read_text(), frame.f_lineno)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return
    if unguarded:
        print(f"hvdtrain: error: {caller}() runs at the top level of {path} (line {frame.f_lineno}); Horovod starts "
              "its helpers with multiprocessing's spawn, which re-runs the script in each: put the call under "
              '`if __name__ == "__main__":`', file=sys.stderr, flush=True)
        raise SystemExit(2)
