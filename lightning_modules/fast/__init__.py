"""Fast paths: same results as the plain code to float rounding (each has a test against it), fewer FLOPs or less
padding: last-token reward scoring, length-bucketed scoring, KV-cache and static-cache sampling."""
