"""Clinic appointments: slots with a capacity that is never exceeded.

The public facade other modules and the console use; they never import the
module's files."""

from reservo.appointments.domain import Appointment
from reservo.appointments.service import AppointmentService

__all__ = ["Appointment", "AppointmentService"]
