"""Scheduling: predict a request's output length, pick its pool, queue and admit
it, run its attempts, and choose replicas. No Ray and no HTTP."""
