"""A record source for the worker tests: importable by build workers (fresh interpreters), light."""

import os


class DyingSource:
    """``n`` short text records; the process reading record ``die_at`` exits at once (a killed worker)."""

    def __init__(self, n: int, die_at: int):
        self.n, self.die_at = n, die_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> bytes:
        if index == self.die_at:
            os._exit(9)
        return b"Record number %d has a few words in it. And a second sentence." % index
