"""Interactive apps for the notebooks, built from paralab.viz and paralab.sim.

Each function returns an ipywidgets container; ipywidgets and plotly are imported when an app is
built, not when this package is imported.
"""


def pipeline_explorer(*args, **kwargs):
    from paralab.widgets.pipeline import pipeline_explorer as app

    return app(*args, **kwargs)


def scaling_explorer(*args, **kwargs):
    from paralab.widgets.explorers import scaling_explorer as app

    return app(*args, **kwargs)


def comm_explorer(*args, **kwargs):
    from paralab.widgets.explorers import comm_explorer as app

    return app(*args, **kwargs)


def speedup_explorer(*args, **kwargs):
    from paralab.widgets.speedup import speedup_explorer as app

    return app(*args, **kwargs)


def collectives_explorer(*args, **kwargs):
    from paralab.widgets.collectives import collectives_explorer as app

    return app(*args, **kwargs)


def memory_explorer(*args, **kwargs):
    from paralab.widgets.explorers import memory_explorer as app

    return app(*args, **kwargs)


def levers_explorer(*args, **kwargs):
    from paralab.widgets.levers import levers_explorer as app

    return app(*args, **kwargs)


def elastic_monitor(*args, **kwargs):
    from paralab.widgets.elastic import elastic_monitor as app

    return app(*args, **kwargs)


_HOMES = {pipeline_explorer: "pipeline", elastic_monitor: "elastic", levers_explorer: "levers",
          speedup_explorer: "speedup", collectives_explorer: "collectives"}
for _f in (pipeline_explorer, scaling_explorer, comm_explorer, speedup_explorer, collectives_explorer,
           memory_explorer, levers_explorer, elastic_monitor):
    _f.__doc__ = (f"Build the {_f.__name__.replace('_', ' ')} "
                  f"(see paralab.widgets.{_HOMES.get(_f, 'explorers')}).")

__all__ = ["pipeline_explorer", "scaling_explorer", "comm_explorer", "speedup_explorer",
           "collectives_explorer", "memory_explorer", "levers_explorer", "elastic_monitor"]
