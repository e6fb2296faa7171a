from serve_app.scheduling.replica_choice import LeastLoadedPolicy, ReplicaLoad


def test_lightest_two_first_counting_tokens_and_queue():
    policy = LeastLoadedPolicy(tokens_per_request=100)
    loads = [
        ReplicaLoad("busy", in_flight_tokens=5000, queue_len=2),
        ReplicaLoad("queued", in_flight_tokens=0, queue_len=9),  # 900
        ReplicaLoad("light", in_flight_tokens=300, queue_len=1),  # 400
        ReplicaLoad("new", in_flight_tokens=None, queue_len=None),  # 0: not reported yet
    ]
    assert policy.rank(loads) == [["new", "light"], ["queued", "busy"]]


def test_small_pools():
    policy = LeastLoadedPolicy()
    assert policy.rank([ReplicaLoad("only", 10, 0)]) == [["only"]]
    assert policy.rank([]) == []


def test_a_replica_that_serves_nothing_more_is_never_offered():
    policy = LeastLoadedPolicy()
    loads = [ReplicaLoad("draining", 0.0, 0, serving=False), ReplicaLoad("busy", 900.0, 3)]
    assert policy.rank(loads) == [["busy"]]  # idle, yet draining: never first, never at all
    assert policy.rank([ReplicaLoad("draining", 0.0, 0, serving=False)]) == []  # wait for a replacement
