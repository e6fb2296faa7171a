from serve_app.scheduling.replica_choice import LeastLoadedPolicy, ReplicaLoad


def test_lightest_two_first_counting_requests_now_weighed_by_their_reported_debt():
    policy = LeastLoadedPolicy(tokens_per_request=100)
    loads = [
        ReplicaLoad("long-answers", in_flight_tokens=5000, queue_len=2, reported_requests=2),  # 2 x 2500
        ReplicaLoad("queued", in_flight_tokens=0, queue_len=9, reported_requests=0),  # 9 x 100 (nothing to average)
        ReplicaLoad("light", in_flight_tokens=300, queue_len=1, reported_requests=1),  # 1 x 300
        ReplicaLoad("new", in_flight_tokens=None, queue_len=None),  # 0: not reported nor probed yet
    ]
    assert policy.rank(loads) == [["new", "light"], ["queued", "long-answers"]]


def test_requests_sent_since_the_last_report_count_at_once():
    """The report says `a` was lighter; since then the router sent it 6 more
    requests: it is the busier one now, though no new report says so."""
    policy = LeastLoadedPolicy(first_rank_size=1)
    a = ReplicaLoad("a", in_flight_tokens=4000, queue_len=4 + 6, reported_requests=4)  # 10 x 1000
    b = ReplicaLoad("b", in_flight_tokens=6000, queue_len=6, reported_requests=6)  # 6 x 1000
    assert policy.rank([a, b]) == [["b"], ["a"]]
    assert policy.rank([ReplicaLoad("a", 4000, None), ReplicaLoad("b", 6000, None)]) == [["a"], ["b"]]  # unprobed: the report


def test_small_pools():
    policy = LeastLoadedPolicy()
    assert policy.rank([ReplicaLoad("only", 10, 0)]) == [["only"]]
    assert policy.rank([]) == []


def test_a_replica_that_serves_nothing_more_is_never_offered():
    policy = LeastLoadedPolicy()
    loads = [ReplicaLoad("draining", 0.0, 0, serving=False), ReplicaLoad("busy", 900.0, 3)]
    assert policy.rank(loads) == [["busy"]]  # idle, yet draining: never first, never at all
    assert policy.rank([ReplicaLoad("draining", 0.0, 0, serving=False)]) == []  # wait for a replacement
