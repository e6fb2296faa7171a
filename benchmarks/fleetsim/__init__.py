"""A discrete-event simulator of this app's serving path on a virtual clock.

The app's own scheduling code runs unchanged (`LengthBucketBatcher` with its
predictor, admission, long-request cap, retries and resume); only what sits
below it is modelled: the replicas' engines (`SimEngine`: vLLM's continuous
batching with a fitted step time), the request router and the pools'
replicas (`SimFleet`). Time is an asyncio event loop's virtual clock
(`virtual_time`), so an hour of traffic runs in seconds of CPU.
"""
