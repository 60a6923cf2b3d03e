-- Argo CD health check for briq.cloud/Execution (resource.customizations.health.briq.cloud_Execution).
-- Like Tekton's TaskRun: Succeeded True -> Healthy, False -> Degraded, Unknown or absent ->
-- Progressing (queued, waiting for its executor, or running).
local hs = { status = "Progressing", message = "Waiting for the operator" }
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
for _, condition in ipairs(obj.status.conditions) do
  if condition.type == "Succeeded" then
    local text = condition.reason or "Succeeded"
    if condition.message ~= nil and condition.message ~= "" then
      text = text .. ": " .. condition.message
    end
    hs.message = text
    if condition.status == "True" then
      hs.status = "Healthy"
    elseif condition.status == "False" then
      hs.status = "Degraded"
    end
    return hs
  end
end
return hs
