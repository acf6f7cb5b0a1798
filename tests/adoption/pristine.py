EXPECTED: dict[str, tuple[str, str]] = {}
