#include "dtensor/nn/module.h"

#include <algorithm>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "dtensor/core/status.h"
#include "dtensor/nn/log.h"

namespace dt::nn {

std::string JoinName(absl::string_view prefix, absl::string_view name) {
  if (prefix.empty()) return std::string(name);
  if (name.empty()) return std::string(prefix);
  return absl::StrCat(prefix, ".", name);
}

Module::Module(std::string type_name) : type_name_(std::move(type_name)) {}
Module::~Module() = default;

std::string Module::FullName() const {
  if (parent_ == nullptr) return "";
  return JoinName(parent_->FullName(), name_);
}

// Here rather than in parameter.cc: a Parameter's name goes through its owner's, and parameter.cc
// stays below module (Note [Include graph]).
std::string Parameter::FullName() const {
  return JoinName(owner_ != nullptr ? owner_->FullName() : "", name_);
}

Parameter& Module::RegisterParameter(std::string name, Shape shape, DType dtype) {
  DT_CHECK(FindParameter(name) == nullptr && FindChild(name) == nullptr, type_name_, ": member '",
           name, "' registered twice");
  params_.push_back(std::make_unique<Parameter>(this, std::move(name), std::move(shape), dtype));
  return *params_.back();
}

void Module::AdoptChild(std::string name, std::unique_ptr<Module> child) {
  DT_CHECK(child != nullptr && child->parent_ == nullptr, type_name_, ": bad child '", name, "'");
  DT_CHECK(FindParameter(name) == nullptr && FindChild(name) == nullptr, type_name_, ": member '",
           name, "' registered twice");
  child->parent_ = this;
  child->name_ = name;
  children_.emplace_back(std::move(name), std::move(child));
}

void Module::SetBuffer(std::string name, Value value) {
  for (auto& [n, v] : buffers_) {
    if (n == name) {
      v = std::move(value);
      return;
    }
  }
  buffers_.emplace_back(std::move(name), std::move(value));
}

Parameter* Module::FindParameter(absl::string_view name) const {
  for (const auto& p : params_) {
    if (p->name() == name) return p.get();
  }
  return nullptr;
}

Module* Module::FindChild(absl::string_view name) const {
  for (const auto& [n, c] : children_) {
    if (n == name) return c.get();
  }
  return nullptr;
}

const Value* Module::FindBuffer(absl::string_view name) const {
  for (const auto& [n, v] : buffers_) {
    if (n == name) return &v;
  }
  return nullptr;
}

absl::StatusOr<Module*> Module::GetSubmodule(absl::string_view path) const {
  Module* m = const_cast<Module*>(this);
  if (path.empty()) return m;
  std::string walked;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    Module* c = m->FindChild(part);
    if (c == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("module '", path, "': ", walked.empty() ? "the root" : "'" + walked + "'",
                       " (", m->type_name(), ") has no child '", part, "'"));
    }
    walked = JoinName(walked, part);
    m = c;
  }
  return m;
}

absl::StatusOr<Parameter*> Module::GetParameter(absl::string_view path) const {
  const size_t dot = path.rfind('.');
  const absl::string_view owner = dot == absl::string_view::npos ? "" : path.substr(0, dot);
  const absl::string_view leaf = dot == absl::string_view::npos ? path : path.substr(dot + 1);
  DT_ASSIGN_OR_RETURN(Module * m, GetSubmodule(owner));
  Parameter* p = m->FindParameter(leaf);
  if (p == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("parameter '", path, "': ", m->type_name(), " has no parameter '", leaf, "'"));
  }
  return p;
}

std::vector<std::pair<std::string, Parameter*>> Module::NamedParameters() const {
  std::vector<std::pair<std::string, Parameter*>> out;
  for (const auto& p : params_) out.emplace_back(p->name(), p.get());
  for (const auto& [n, c] : children_) {
    for (auto& [cn, p] : c->NamedParameters()) out.emplace_back(JoinName(n, cn), p);
  }
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::NamedModules() {
  std::vector<std::pair<std::string, Module*>> out;
  out.emplace_back("", this);
  for (const auto& [n, c] : children_) {
    for (auto& [cn, m] : c->NamedModules()) out.emplace_back(JoinName(n, cn), m);
  }
  return out;
}

std::vector<std::pair<std::string, const Value*>> Module::NamedBuffers() const {
  std::vector<std::pair<std::string, const Value*>> out;
  for (const auto& [n, v] : buffers_) out.emplace_back(n, &v);
  for (const auto& [n, c] : children_) {
    for (auto& [cn, v] : c->NamedBuffers()) out.emplace_back(JoinName(n, cn), v);
  }
  return out;
}

namespace {

// True when `message` starts with "<path>: " for `m` itself or a module below it: an inner Call
// named it already (Note [Errors name the module]).
bool NamedBelow(const Module& m, absl::string_view message) {
  const size_t colon = message.find(": ");
  if (colon == absl::string_view::npos || colon == 0) return false;
  const absl::string_view first = message.substr(0, colon);
  const std::string self = m.FullName();
  if (self.empty()) {
    return first == m.type_name() || m.GetSubmodule(first).ok();
  }
  if (first == self) return true;
  if (!absl::StartsWith(first, self + ".")) return false;
  return m.GetSubmodule(first.substr(self.size() + 1)).ok();
}

// Note [Unmatched keys]: the plan rules that matched nothing, from the nearest module above `m`
// (itself included) that ParallelizeModule recorded them on.
std::string UnmatchedNote(const Module& m) {
  for (const Module* p = &m; p != nullptr; p = p->parent()) {
    if (p->unmatched_plan_keys().empty()) continue;
    return absl::StrCat(" (the TP plan's rules [", absl::StrJoin(p->unmatched_plan_keys(), ", "),
                        "] matched no layer: a misspelled key leaves its layer replicated)");
  }
  return "";
}

// `s` prefixed with the module's path, unless an inner Call did it, and ending with the
// unmatched plan keys once.
absl::Status NameModule(const Module& m, absl::Status s) {
  if (s.ok()) return s;
  const std::string note = UnmatchedNote(m);
  const bool named = NamedBelow(m, s.message());
  const bool noted = note.empty() || absl::EndsWith(s.message(), note);
  if (named && noted) return s;
  const std::string path = m.FullName().empty() ? m.type_name() : m.FullName();
  absl::Status out(s.code(), absl::StrCat(named ? "" : absl::StrCat(path, ": "), s.message(),
                                          noted ? "" : note));
  s.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) {
    out.SetPayload(url, payload);
  });
  return out;
}

}  // namespace

absl::StatusOr<Values> Module::Call(Values inputs) {
  auto run = [&]() -> absl::StatusOr<Values> {
    for (auto& [id, hook] : pre_hooks_) DT_RETURN_IF_ERROR(hook(*this, inputs));
    Values outputs;
    if (installed_forward_) {
      DT_ASSIGN_OR_RETURN(outputs, installed_forward_(*this, inputs));
    } else {
      DT_ASSIGN_OR_RETURN(outputs, RunForward(inputs));
    }
    for (auto& [id, hook] : hooks_) DT_RETURN_IF_ERROR(hook(*this, inputs, outputs));
    return outputs;
  };
  absl::StatusOr<Values> out = run();
  if (!out.ok()) return NameModule(*this, std::move(out).status());
  if (parent_ == nullptr) DT_RETURN_IF_ERROR(NameModule(*this, GatherPieces(*out)));
  return out;
}

absl::Status Module::GatherPieces(Values& outputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    // A piece the root's own style made was asked for (the root is the styled layer itself).
    const DTensor* whole = outputs[i].piece_of();
    if (whole == nullptr || outputs[i].source().empty()) continue;
    const std::optional<std::vector<int64_t>>& coord = whole->mesh().Coordinate();
    if (!warned_gather_ && coord && std::all_of(coord->begin(), coord->end(),
                                                 [](int64_t c) { return c == 0; })) {
      LogWarning(absl::StrCat(
          type_name_, ": output ", i, " is ", outputs[i].Describe(),
          "; gathered it whole (plan '", outputs[i].source(),
          "' as colwise_gather_output to gather it there, or keep DTensors to leave it sharded)"));
    }
    DT_ASSIGN_OR_RETURN(Tensor full, whole->FullTensor());
    outputs[i] = Value(std::move(full));
    warned_gather_ = true;
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> Module::CallOne(Values inputs) {
  DT_ASSIGN_OR_RETURN(Values out, Call(std::move(inputs)));
  if (out.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(type_name_, " '", FullName(), "' returned ",
                                                   out.size(), " outputs, expected 1"));
  }
  return std::move(out[0]);
}

absl::StatusOr<Values> Module::RunForward(Values inputs) {
  const bool any_local =
      std::any_of(inputs.begin(), inputs.end(), [](const Value& v) { return v.is_local(); });
  const bool previous = std::exchange(local_inputs_, any_local);
  absl::StatusOr<Values> out = Forward(std::move(inputs));
  local_inputs_ = previous;
  return out;
}

HookId Module::RegisterForwardPreHook(ForwardPreHook hook) {
  pre_hooks_.emplace_back(next_hook_id_, std::move(hook));
  return next_hook_id_++;
}

HookId Module::RegisterForwardHook(ForwardHook hook) {
  hooks_.emplace_back(next_hook_id_, std::move(hook));
  return next_hook_id_++;
}

bool Module::RemoveHook(HookId id) {
  auto drop = [id](auto& list) {
    const auto it =
        std::find_if(list.begin(), list.end(), [id](const auto& e) { return e.first == id; });
    if (it == list.end()) return false;
    list.erase(it);
    return true;
  };
  return drop(pre_hooks_) || drop(hooks_);
}

absl::StatusOr<const Parameter*> Module::MaterializedParam(absl::string_view name) const {
  const Parameter* p = FindParameter(name);
  if (p == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(type_name_, " '", FullName(), "' has no parameter '", name, "'"));
  }
  if (!p->materialized()) {
    return absl::FailedPreconditionError(
        absl::StrCat("parameter '", p->FullName(), "' is not materialized (", p->Describe(),
                     "); load or initialize it before the forward (nn/init.h)"));
  }
  return p;
}

absl::StatusOr<Value> Module::ParamValue(absl::string_view name) const {
  DT_ASSIGN_OR_RETURN(const Parameter* p, MaterializedParam(name));
  if (!local_mode()) return Value(p->value());
  if (!local_mode_ && p->spec().NumShards() > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "parameter '", p->FullName(), "' is sharded (", p->Describe(), ") but ", type_name_, " '",
        FullName(), "' received local inputs without a style that computes on local shards; give '",
        FullName(), "' a module rule (e.g. rowwise, local_params) or pass DTensors"));
  }
  return Value(p->value().ToLocal());
}

absl::StatusOr<Tensor> Module::LocalParam(absl::string_view name) const {
  DT_ASSIGN_OR_RETURN(const Parameter* p, MaterializedParam(name));
  return p->value().ToLocal();
}

// Note [Mixed projections]
// Sibling projections whose outputs a forward combines head by head or element by element (q, k
// and v; gate and up) must be split alike. A module of nn's own checks its plan itself (Attention
// pairs a rank's query heads with the KV heads they use when only q_proj is split); any other
// module — one the user wrote, whose forward nobody here knows — would combine this rank's slice
// of one with the whole of the other and compute something else without an error (q·kᵀ over
// heads that do not belong together: logits off by 5.5 in the report of issue 31). So by default a
// module whose children of one group are split differently by the plan is refused before anything
// is placed, naming the module and the two placements.
absl::Status Module::ValidateTensorParallel(const TPValidationContext& ctx) const {
  static const auto* const kGroups = new std::vector<std::vector<std::string>>{
      {"q_proj", "k_proj", "v_proj"}, {"query", "key", "value"}, {"to_q", "to_k", "to_v"},
      {"wq", "wk", "wv"},             {"gate_proj", "up_proj"},  {"w1", "w3"}};
  for (const std::vector<std::string>& group : *kGroups) {
    const std::string* first = nullptr;
    for (const std::string& child : group) {
      if (FindChild(child) == nullptr) continue;
      if (first == nullptr) {
        first = &child;
        continue;
      }
      if (ctx.OutputSharded(*first) == ctx.OutputSharded(child)) continue;
      const std::string a = *first + ".weight", b = child + ".weight";
      return absl::InvalidArgumentError(absl::StrCat(
          type_name_, " '", ctx.module_name(), "': ", a, " is [",
          ctx.PlannedPlacement(a).ToString(), "] (output ",
          ctx.OutputSharded(*first) ? "split" : "whole", ") but ", b, " is [",
          ctx.PlannedPlacement(b).ToString(), "] (output ", ctx.OutputSharded(child) ? "split" : "whole",
          "): a forward that combines them would pair this rank's slice of one with the whole of "
          "the other and compute something else (Note [Mixed projections] in nn/module.cc). Plan [",
          absl::StrJoin(group, ", "), "] alike, or build the block from nn::Attention / "
          "nn::SwiGLUMLP, which pair heads and columns themselves"));
    }
  }
  return absl::OkStatus();
}

std::vector<int64_t> Module::PackedBlocks(const Parameter&, bool) const { return {}; }

int64_t Module::ShardUnit(const Parameter&, bool) const { return 0; }

std::string Module::ToString() const {
  std::string out;
  AppendTree(&out, "");
  return out;
}

void Module::AppendTree(std::string* out, const std::string& indent) const {
  absl::StrAppend(out, type_name_, "(", ExtraRepr(), ")");
  if (!tp_style_.empty()) absl::StrAppend(out, " [", tp_style_, "]");
  if (params_.empty() && children_.empty()) return;
  absl::StrAppend(out, " {\n");
  const std::string inner = indent + "  ";
  for (const auto& p : params_) absl::StrAppend(out, inner, p->name(), ": ", p->Describe(), "\n");
  for (const auto& [n, c] : children_) {
    absl::StrAppend(out, inner, "(", n, "): ");
    c->AppendTree(out, inner);
    absl::StrAppend(out, "\n");
  }
  absl::StrAppend(out, indent, "}");
}

absl::StatusOr<Value> SingleInput(const Module& module, const Values& inputs) {
  if (inputs.size() != 1 || !inputs[0].defined()) {
    return absl::InvalidArgumentError(absl::StrCat(module.type_name(), " '", module.FullName(),
                                                   "' takes one input, got ", inputs.size()));
  }
  return inputs[0];
}

absl::StatusOr<Values> ModuleList::Forward(Values) {
  return absl::FailedPreconditionError(absl::StrCat(
      "ModuleList '", FullName(), "' has no forward; iterate its ", size(), " modules instead"));
}

}  // namespace dt::nn
