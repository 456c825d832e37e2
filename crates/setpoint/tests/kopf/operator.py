"""A small kopf operator for Widgets: the create handler reports through the status, the
delete handler (which makes kopf put a finalizer on every Widget) leaves a marker file so the
test can see it ran before the object went away."""

import os

import kopf


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    # Post handler log messages as Kubernetes Events too (off by default in kopf).
    settings.posting.loggers = True


@kopf.on.create("example.com", "v1", "widgets")
def create_fn(body, spec, name, logger, **_):
    size = spec.get("size", 0)
    logger.info(f"widget {name} of size {size} created")
    kopf.info(body, reason="Created", message=f"widget {name} has size {size}")
    return {"message": f"created {name} with size {size}"}


@kopf.on.update("example.com", "v1", "widgets")
def update_fn(spec, name, **_):
    return {"message": f"updated {name} to size {spec.get('size', 0)}"}


@kopf.on.delete("example.com", "v1", "widgets")
def delete_fn(name, **_):
    marker = os.path.join(os.environ["WIDGET_MARKERS"], name)
    with open(marker, "w") as f:
        f.write("deleted")
