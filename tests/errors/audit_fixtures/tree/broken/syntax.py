def broken(:  # expect: OMNI000
    raise ValueError("never parsed, never counted")
