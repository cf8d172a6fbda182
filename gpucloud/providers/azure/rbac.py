"""The least-privilege custom role gpucloud needs on Azure (`gpucloud iam-policy azure`), instead of
Owner or Contributor + User Access Administrator.

Pure data. Why it is shaped this way:
- every run lives in a resource group of its own (`gpucloud-<run>`), so the role creates, reads
  and deletes resource groups and, inside them, exactly the resource types a run makes: the
  network (NSG, VNet and subnet, public IPs, NICs), VMs and their extensions, proximity placement
  groups and availability sets (multi-node), the run's storage account and its keys (the channel),
  images (`image build/rm`);
- `join/action` on subnets, NSGs, public IPs and NICs: ARM checks them as linked authorisations
  when a NIC or VM refers to them (LinkedAuthorizationFailed without);
- `roleAssignments/write`: each VM's identity gets Contributor on its own group, so that it can
  delete the group at its deadline (roles.py), and the node role below on the channel container,
  narrowed to its run by a condition, so that it reaches its run's blobs as itself
  (node_access.py); `roleAssignments/delete` removes the latter at teardown and gc, `read` lists
  them for gc. Writing assignments could grant any role at any scope the role is assigned at, so
  attach the role with the condition `assignment_condition()` prints (Azure ABAC "delegate role
  assignments with conditions"): only those two roles may be assigned or deleted;
- reads for `check` (the subscription, its locations), `catalog refresh` (resource SKUs), the GPU
  quota before a launch (compute usages), and gc (resource groups by tag);
- data grants: the user-delegation key for SAS URLs on the user's own buckets and the blob data
  actions they sign for (`dataActions`); container images: an ACR pull token (`pull/read`).
A test runs the Azure command tests against the fake ARM with only these actions
(tests/support/arm_actions.py: an unknown action is denied there, stricter than Azure).
"""

from __future__ import annotations

import uuid
from typing import Any

ROLE_NAME = "gpucloud runner"
CONTRIBUTOR_ROLE_ID = "b24988ac-6180-42a0-ab88-20f7382dd24c"  # the role a VM gets on its own group
# The node's role on the channel container: blob data actions only. Not the built-in Storage Blob
# Data Contributor: that one also holds containers/{read,write,delete} and generateUserDelegationKey
# (control-plane Actions no role assignment condition narrows: conditions apply to data actions), so
# a job could delete the region's whole channel container with its VM's ARM token.
NODE_ROLE_NAME = "gpucloud node channel"
NODE_DATA_ACTIONS: tuple[str, ...] = (
    "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/read",
    "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/write",
    "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/add/action",
)

_RESOURCES = "Microsoft.Resources/subscriptions"
_RW_DELETE = ("read", "write", "delete")

ACTIONS: tuple[str, ...] = (
    f"{_RESOURCES}/read",
    f"{_RESOURCES}/locations/read",
    *(f"{_RESOURCES}/resourceGroups/{v}" for v in _RW_DELETE),
    f"{_RESOURCES}/resourceGroups/resources/read",
    *(f"Microsoft.Network/networkSecurityGroups/{v}" for v in (*_RW_DELETE, "join/action")),
    *(f"Microsoft.Network/virtualNetworks/{v}" for v in _RW_DELETE),
    *(f"Microsoft.Network/virtualNetworks/subnets/{v}" for v in (*_RW_DELETE, "join/action")),
    *(f"Microsoft.Network/publicIPAddresses/{v}" for v in (*_RW_DELETE, "join/action")),
    *(f"Microsoft.Network/networkInterfaces/{v}" for v in (*_RW_DELETE, "join/action")),
    *(f"Microsoft.Compute/virtualMachines/{v}" for v in _RW_DELETE),
    "Microsoft.Compute/virtualMachines/deallocate/action",
    "Microsoft.Compute/virtualMachines/generalize/action",
    "Microsoft.Compute/virtualMachines/runCommand/action",
    *(f"Microsoft.Compute/virtualMachines/extensions/{v}" for v in _RW_DELETE),
    *(f"Microsoft.Compute/proximityPlacementGroups/{v}" for v in _RW_DELETE),
    *(f"Microsoft.Compute/availabilitySets/{v}" for v in _RW_DELETE),
    *(f"Microsoft.Compute/images/{v}" for v in _RW_DELETE),
    "Microsoft.Compute/disks/read",
    "Microsoft.Compute/disks/delete",
    "Microsoft.Compute/skus/read",
    "Microsoft.Compute/locations/publishers/artifacttypes/offers/skus/versions/read",  # an image's OS disk size
    "Microsoft.Compute/locations/usages/read",
    "Microsoft.Storage/storageAccounts/read",
    "Microsoft.Storage/storageAccounts/write",
    "Microsoft.Storage/storageAccounts/listKeys/action",
    "Microsoft.Storage/storageAccounts/blobServices/generateUserDelegationKey/action",
    "Microsoft.Authorization/roleDefinitions/read",  # `check`: is the role of `setup azure` there
    "Microsoft.Authorization/roleAssignments/read",
    "Microsoft.Authorization/roleAssignments/write",
    "Microsoft.Authorization/roleAssignments/delete",
    "Microsoft.ContainerRegistry/registries/pull/read",
)
DATA_ACTIONS: tuple[str, ...] = (
    "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/read",
    "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/write",
)


def role_id(subscription: str) -> str:
    """The role definition's name (a GUID), the same for a subscription on every run of setup."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpucloud-runner/{subscription.lower()}"))


def node_role_id(subscription: str) -> str:
    """The node role's definition name (a GUID), per subscription like the runner role's."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpucloud-node-channel/{subscription.lower()}"))


def node_role_definition(subscription: str | None = None) -> dict[str, Any]:
    """The node's role (`az role definition create` shape): no control-plane Actions at all; no
    delete or move of blobs; each assignment's condition narrows it to one run (node_access.py)."""
    return {
        "Name": NODE_ROLE_NAME,
        "IsCustom": True,
        "Description": "gpucloud: a VM's identity reads and writes its own run's channel blobs (the role "
        "assignment's condition names the run); it cannot delete a blob or touch the container.",
        "Actions": [],
        "NotActions": [],
        "DataActions": list(NODE_DATA_ACTIONS),
        "NotDataActions": [],
        "AssignableScopes": [f"/subscriptions/{subscription or '<subscription-id>'}"],
    }


def role_definition(subscription: str | None = None) -> dict[str, Any]:
    """The custom role, in the shape `az role definition create --role-definition` reads."""
    scope = f"/subscriptions/{subscription or '<subscription-id>'}"
    return {
        "Name": ROLE_NAME,
        "IsCustom": True,
        "Description": "gpucloud: run, watch, collect, down, gc, catalog refresh, check, image build/ls/rm, "
        "data grants and registry tokens; nothing outside gpucloud's own resource groups is changed.",
        "Actions": list(ACTIONS),
        "NotActions": [],
        "DataActions": list(DATA_ACTIONS),
        "NotDataActions": [],
        "AssignableScopes": [scope],
    }


def arm_body(subscription: str, role: dict[str, Any] | None = None) -> dict[str, Any]:
    """A role (the runner's unless given) as the body of ARM's roleDefinitions PUT."""
    role = role or role_definition(subscription)
    return {
        "properties": {
            "roleName": role["Name"],
            "description": role["Description"],
            "type": "CustomRole",
            "permissions": [
                {
                    "actions": role["Actions"],
                    "notActions": [],
                    "dataActions": role["DataActions"],
                    "notDataActions": [],
                }
            ],
            "assignableScopes": role["AssignableScopes"],
        }
    }


def assignment_condition(subscription: str) -> str:
    """The ABAC condition that limits what the role's holder may assign (and delete) to Contributor
    and the node role of `subscription` (ARM roleAssignments condition version 2.0)."""
    roles = f"{{{CONTRIBUTOR_ROLE_ID}, {node_role_id(subscription)}}}"
    return (
        "((!(ActionMatches{'Microsoft.Authorization/roleAssignments/write'})) OR "
        "(@Request[Microsoft.Authorization/roleAssignments:RoleDefinitionId] "
        f"ForAnyOfAnyValues:GuidEquals {roles})) AND "
        "((!(ActionMatches{'Microsoft.Authorization/roleAssignments/delete'})) OR "
        "(@Resource[Microsoft.Authorization/roleAssignments:RoleDefinitionId] "
        f"ForAnyOfAnyValues:GuidEquals {roles}))"
    )


def policy_document() -> dict[str, Any]:
    """What `gpucloud iam-policy azure` prints: the role definition, ready for `az role definition
    create --role-definition @file` (the subscription from AZURE_SUBSCRIPTION_ID when set)."""
    import os

    return role_definition(os.environ.get("AZURE_SUBSCRIPTION_ID") or None)


def assign_command(subscription: str) -> str:
    return (
        f'az role assignment create --assignee <user-or-app-id> --role "{ROLE_NAME}" '
        f'--scope /subscriptions/{subscription} --condition "{assignment_condition(subscription)}" '
        "--condition-version 2.0"
    )
