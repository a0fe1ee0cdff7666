"""A step's energy divided among the agents in it by what each read: the weight stream, which one decode step
reads once for the whole batch, evenly; each agent's own KV cache, to that agent (its share of the step's KV
bytes in proportion to its context). A prefill step carries one agent's chunk, so it is that agent's. The
shares add up to the step's joules (measured where a sensor exists, modeled otherwise, as the step says); a
step without an energy figure (no power source, a KV rebuild) and an idle step give no one anything."""

from swarmtune.engine.record.records import StepRecord


def joules_by_agent(rec: StepRecord) -> dict[int, float]:
    ids = rec.batch_ids
    if rec.joules is None or not ids:
        return {}
    if len(ids) == 1:
        return {ids[0]: rec.joules}
    contexts = {v.id: v.context for v in rec.agents}
    ctx = [contexts.get(i, 0) for i in ids]
    total_ctx = sum(ctx)
    weight_each = rec.weight_bytes / len(ids)
    read = [weight_each + (rec.kv_bytes * c / total_ctx if total_ctx else rec.kv_bytes / len(ids)) for c in ctx]
    total = sum(read)
    if total <= 0:  # nothing read (a lean forecast's record): evenly
        return {i: rec.joules / len(ids) for i in ids}
    return {i: rec.joules * r / total for i, r in zip(ids, read, strict=True)}
