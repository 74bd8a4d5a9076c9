"""Incidents, event-sourced (see docs/incidents.md).

``IncidentBook`` folds one job's events (in event-time order) into incidents and returns the
``incident.transition`` events each one causes; ``rebuild(events)`` does it for a whole log.
``LiveIncidents`` puts a reorder buffer in front of the books for a service reading topics.
"""

from trainguard.incidents.aggregate import IncidentBook, rebuild, rebuild_incidents
from trainguard.incidents.live import LiveIncidents
from trainguard.incidents.model import Incident
from trainguard.incidents.settings import IncidentSettings

__all__ = ["Incident", "IncidentBook", "IncidentSettings", "LiveIncidents", "rebuild",
           "rebuild_incidents"]
