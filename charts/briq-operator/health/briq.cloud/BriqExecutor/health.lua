-- Argo CD health check for briq.cloud/BriqExecutor (resource.customizations.health.briq.cloud_BriqExecutor).
-- Deleting -> Progressing (the finalizer destroys the sandbox); Stalled=True -> Degraded (a failed
-- setup or an unusable executor: final, create a new one); Ready=True -> Healthy; anything else,
-- including a status older than the spec, -> Progressing.
local hs = { status = "Progressing", message = "Waiting for the operator" }
if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.message = "Deleting: destroying the sandbox"
  return hs
end
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
local generation = obj.metadata and obj.metadata.generation
if generation ~= nil and (obj.status.observedGeneration == nil or obj.status.observedGeneration < generation) then
  hs.message = "Waiting for the operator to observe generation " .. generation
  return hs
end
local ready, stalled
for _, condition in ipairs(obj.status.conditions) do
  if condition.type == "Ready" then
    ready = condition
  elseif condition.type == "Stalled" then
    stalled = condition
  end
end
local function describe(condition)
  local text = condition.reason or condition.type
  if condition.message ~= nil and condition.message ~= "" then
    text = text .. ": " .. condition.message
  end
  return text
end
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(stalled)
  return hs
end
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(ready)
  return hs
end
if ready ~= nil then
  hs.message = describe(ready)
end
return hs
