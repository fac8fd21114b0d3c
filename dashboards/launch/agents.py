"""The agent registry: saving agent definitions (admins only; audited)."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser

from dashboards.core.audit import audit, refused
from dashboards.core.roles import is_admin
from dashboards.models import AgentDefinition


def agent_definition_save(*, user: AbstractBaseUser, definition: AgentDefinition) -> AgentDefinition:
    """Save an agent definition from the registry form (admins only; audited). Raises ActionRefused."""
    target = f"agent:{definition.name}:v{definition.version}"
    params = {"name": definition.name, "version": definition.version, "command": definition.command,
              "input_kind": definition.input_kind, "default_model": definition.default_model}
    if not is_admin(user):
        raise refused(user, "agent_definition_save", target, params, "only admins may edit agent definitions")
    created = definition.pk is None
    definition.save()
    audit(user=user, action="agent_definition_save", target=target, params={**params, "status": "done"}, ok=True,
          result="created" if created else "updated")
    return definition
