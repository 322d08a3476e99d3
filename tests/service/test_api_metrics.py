from service.runtime.cpu_limit import cpu_limit


async def test_metrics_exposed(served) -> None:
    c = served.client
    await c.post("/v1/classify", json={"text": "hi"})
    await c.post("/v1/generate", json={"prompt": "hi", "max_new_tokens": 3, "stream": True, "ignore_eos": True})
    await c.post("/v1/translate", json={"text": "hi", "max_new_tokens": 3})
    await c.post("/v1/classify", json={"text": ""})
    r = await c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    limit = cpu_limit()
    spin = "false" if limit is not None else "true"
    for needle in [
        'serve_requests_total{endpoint="/v1/classify",status="200"} 1.0',
        'serve_requests_total{endpoint="/v1/classify",status="422"} 1.0',
        'serve_request_duration_seconds_bucket{endpoint="/v1/generate",',
        'serve_queue_time_seconds_count{model="classifier"}',
        'serve_batch_size_bucket{le="1.0",model="generator",phase="decode"}',
        'serve_queue_depth{model="translator"}',
        'serve_time_to_first_token_seconds_count{model="generator"} 1.0',
        'serve_inter_token_latency_seconds_count{model="generator"} 2.0',
        'serve_generated_tokens_total{model="generator"} 3.0',
        # the test settings' one thread; the threads park under a CPU limit and spin without one
        f'serve_runtime_info{{cpu_limit="{limit or 0:g}",intra_op_threads="1",spin_between_runs="{spin}"}} 1.0',
    ]:
        assert needle in text, needle
