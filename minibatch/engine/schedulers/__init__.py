"""Schedulers: static, continuous and edge batching, each turning the queue into a step plan."""
from minibatch.engine.schedulers.base import ScheduledSeq, Scheduler, StepPlan
from minibatch.engine.schedulers.continuous import ContinuousScheduler
from minibatch.engine.schedulers.edge import EdgeScheduler
from minibatch.engine.schedulers.static import StaticScheduler

SCHEDULER_CLASSES = {"static": StaticScheduler, "continuous": ContinuousScheduler, "edge": EdgeScheduler}


def make_scheduler(config, block_manager) -> Scheduler:
    return SCHEDULER_CLASSES[config.scheduler](config, block_manager)


__all__ = ["ScheduledSeq", "Scheduler", "StepPlan", "make_scheduler", "SCHEDULER_CLASSES",
           "StaticScheduler", "ContinuousScheduler", "EdgeScheduler"]
