"""The machine every other figure in this run comes from: CPU, cores, torch's kernels, the precision path.

Prints `name: value` lines (first in `make bench`, so the results file starts with them).
"""

from __future__ import annotations

import datetime

from course_utils.core.hardware import cpu_precision, machine_summary


def main() -> None:
    print(f"measured_on: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}")
    for name, value in machine_summary().items():
        print(f"{name}: {value}")
    print(f"cpu_precision_reason: {cpu_precision().reason}")


if __name__ == "__main__":
    main()
