#include "dtensor/tools/flags.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace dt::cli {
namespace {

bool Ours(const absl::CommandLineFlag& f, const ParseOptions& o) {
  if (absl::StrContains(f.Filename(), "absl/")) return false;
  return o.only.empty() || std::find(o.only.begin(), o.only.end(), f.Name()) != o.only.end();
}

absl::flat_hash_set<std::string>& GivenNames() {
  static auto* given = new absl::flat_hash_set<std::string>();
  return *given;
}

const char* TypeOf(const absl::CommandLineFlag& f) {
  if (f.IsOfType<bool>()) return "bool";
  if (f.IsOfType<int32_t>() || f.IsOfType<int64_t>()) return "int";
  if (f.IsOfType<double>() || f.IsOfType<float>()) return "number";
  if (f.IsOfType<std::vector<std::string>>()) return "list";
  return "string";
}

[[noreturn]] void Fail(absl::string_view program, const std::string& message) {
  std::fprintf(stderr, "%s: %s (see %s --help)\n", std::string(program).c_str(), message.c_str(),
               std::string(program).c_str());
  std::exit(2);
}

std::string Basename(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return std::string(slash == absl::string_view::npos ? path : path.substr(slash + 1));
}

}  // namespace

bool Given(absl::string_view name) { return GivenNames().contains(name); }

std::string FlagsHelp(absl::string_view program, absl::string_view usage, const ParseOptions& options) {
  std::vector<absl::CommandLineFlag*> flags;
  for (const auto& [name, f] : absl::GetAllFlags()) {
    if (Ours(*f, options)) flags.push_back(f);
  }
  std::sort(flags.begin(), flags.end(), [](auto* a, auto* b) { return a->Name() < b->Name(); });
  std::string out = absl::StrCat(usage, "\n\nflags:\n");
  for (const absl::CommandLineFlag* f : flags) {
    const std::string name = absl::StrReplaceAll(f->Name(), {{"_", "-"}});
    std::string def = f->DefaultValue();
    if (std::string(TypeOf(*f)) == "string" || std::string(TypeOf(*f)) == "list") def = absl::StrCat("\"", def, "\"");
    absl::StrAppend(&out, "  --", name, " (", TypeOf(*f), ", default ", def, ")\n      ", f->Help(), "\n");
  }
  if (flags.empty()) absl::StrAppend(&out, "  (none)\n");
  absl::StrAppend(&out, "  --help\n      this text\n");
  return out;
}

std::vector<std::string> ParseFlags(int argc, char** argv, absl::string_view usage, const ParseOptions& options) {
  const std::string program = Basename(argc > 0 ? argv[0] : "program");
  std::vector<std::string> positional = {argc > 0 ? argv[0] : program};
  GivenNames().clear();
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      for (++i; i < argc; ++i) positional.push_back(argv[i]);
      break;
    }
    if (arg == "--help" || arg == "-h" || arg == "-help") {
      std::fputs(FlagsHelp(program, usage, options).c_str(), stdout);
      std::exit(0);
    }
    if (arg.size() < 2 || arg[0] != '-' || arg == "-") {
      if (options.stop_at_positional) {
        for (; i < argc; ++i) positional.push_back(argv[i]);
        break;
      }
      positional.push_back(arg);
      continue;
    }
    // -x and --x alike; '-' in names reads as '_'.
    std::string body = arg.substr(arg[1] == '-' ? 2 : 1);
    std::string value;
    const size_t eq = body.find('=');
    const bool has_value = eq != std::string::npos;
    if (has_value) {
      value = body.substr(eq + 1);
      body = body.substr(0, eq);
    }
    const std::string name = absl::StrReplaceAll(body, {{"-", "_"}});
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    bool negated = false;
    if ((flag == nullptr || !Ours(*flag, options)) && absl::StartsWith(name, "no") && !has_value) {
      absl::CommandLineFlag* positive =
          absl::FindCommandLineFlag(name.substr(absl::StartsWith(name, "no_") ? 3 : 2));
      if (positive != nullptr && Ours(*positive, options) && positive->IsOfType<bool>()) {
        flag = positive;
        negated = true;
      }
    }
    if (flag == nullptr || !Ours(*flag, options)) Fail(program, absl::StrCat("unknown flag --", body));
    if (flag->IsOfType<bool>()) {
      if (!has_value) value = negated ? "false" : "true";
    } else if (!has_value) {
      if (i + 1 >= argc) Fail(program, absl::StrCat("--", body, " needs a value"));
      value = argv[++i];
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      Fail(program, absl::StrCat("--", body, "='", value, "': ", error));
    }
    GivenNames().insert(std::string(flag->Name()));
  }
  return positional;
}

}  // namespace dt::cli
