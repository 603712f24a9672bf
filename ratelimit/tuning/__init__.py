"""`modelyard ratelimit tune`: limits from recorded traffic.

traces (inputs) -> replay (one bucket, exact) -> frontier (smallest burst per rate, a pick) ->
whatif (a whole config over the traffic) -> emit (the ratelimit: section) -> plots, report -> cli.
"""
