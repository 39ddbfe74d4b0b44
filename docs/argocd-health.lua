-- Argo CD health check for maka-eval's Experiment, Cell and Attempt (eval.maka.dev).
--
-- The operator writes the three kstatus conditions on every object it reconciles, exactly
-- one of them True, each with observedGeneration:
--   Ready        the object reached a good end   (Experiment Complete, Cell ResultSelected,
--                                                 Attempt Completed / SubjectFailed)
--   Reconciling  the operator is still at work    (Running, PrerequisitesMissing, Retrying)
--   Stalled      it will not move without you     (InvalidSpec, BudgetExhausted, CellsFailed,
--                                                 RetriesExhausted, InfraFailed, Cancelled)
-- Argo CD: Ready -> Healthy, Reconciling -> Progressing, Stalled -> Degraded. A condition
-- written for an older generation than metadata.generation does not count. Install it as
-- resource.customizations.health.eval.maka.dev_<Kind> (examples/gitops/argocd/).
local hs = {}
local generation = nil
if obj.metadata ~= nil then
  generation = obj.metadata.generation
end

local function current(condition)
  if generation == nil or condition.observedGeneration == nil then
    return true
  end
  return condition.observedGeneration >= generation
end

local function describe(condition)
  local reason = condition.reason or ""
  local message = condition.message or ""
  if reason ~= "" and message ~= "" then
    return reason .. ": " .. message
  end
  return reason .. message
end

if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the maka-eval operator to report on this object"
  return hs
end

if generation ~= nil and obj.status.observedGeneration ~= nil
    and obj.status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the maka-eval operator to observe generation " .. generation
  return hs
end

local found = {}
for _, condition in ipairs(obj.status.conditions) do
  if condition.type ~= nil and condition.status == "True" and current(condition) then
    found[condition.type] = condition
  end
end

if found["Stalled"] ~= nil then
  hs.status = "Degraded"
  hs.message = describe(found["Stalled"])
elseif found["Ready"] ~= nil then
  hs.status = "Healthy"
  hs.message = describe(found["Ready"])
elseif found["Reconciling"] ~= nil then
  hs.status = "Progressing"
  hs.message = describe(found["Reconciling"])
else
  hs.status = "Progressing"
  hs.message = "Waiting for the maka-eval operator to report Ready, Reconciling or Stalled"
end
return hs
