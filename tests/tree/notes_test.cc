// Every citation of a Note has the Note it cites (CONTRIBUTING.md, "Code": long rationale stands
// once, as a Note, and is cited by its title elsewhere).
//
// Read from every text file of the tree (code, CMake, scripts, docs; not build trees, not data):
//   - a definition is a comment line (// or #) that holds the word Note and the title in square
//     brackets and nothing else, or those and a colon and a summary;
//   - a citation is any other occurrence of the word and a bracketed title, in a comment, a string
//     or a doc, its title possibly broken over lines (comment leaders and the quotes of a string
//     literal continued on the next line are read through). In Markdown, one inside a code span
//     shows the form rather than cites a Note and is skipped;
//   - a citation followed by `in path` or `(path)` (a file name with its ending) names where the
//     Note stands: one of its definitions must be in a file whose path ends with it.
// The test fails on a citation with no definition and on one that names the wrong file.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "dtensor/tests/test_util.h"

namespace dt {
namespace {

namespace fs = std::filesystem;

// "Note [" without writing it here (this file would cite its own examples).
const std::string kOpen = std::string("Note") + " [";

struct Citation {
  std::string title;
  std::string file;
  int line = 0;
  std::string where;  // the file it names, "" when none
};

struct Notes {
  std::map<std::string, std::vector<std::string>> defined;  // title -> the files defining it
  std::vector<Citation> cited;
};

// The title of a definition line, or "" when the line is not one.
std::string DefinitionTitle(absl::string_view line) {
  line = absl::StripLeadingAsciiWhitespace(line);
  if (!absl::ConsumePrefix(&line, "//") && !absl::ConsumePrefix(&line, "#")) return "";
  line = absl::StripLeadingAsciiWhitespace(line);
  if (!absl::ConsumePrefix(&line, kOpen)) return "";
  const size_t close = line.find(']');
  if (close == absl::string_view::npos || close == 0) return "";
  const absl::string_view rest = absl::StripAsciiWhitespace(line.substr(close + 1));
  if (!rest.empty() && rest[0] != ':') return "";
  return std::string(line.substr(0, close));
}

// Text that runs over line breaks read as one line: at each break, the spaces around it, a comment
// leader (//, #, *) and a string literal's closing and reopening quotes become one space.
std::string Unwrap(absl::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\n') {
      out += text[i];
      continue;
    }
    while (!out.empty() && (out.back() == ' ' || out.back() == '"')) out.pop_back();
    ++i;
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
    while (i < text.size() && (text[i] == '/' || text[i] == '#' || text[i] == '*')) ++i;
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == '"')) ++i;
    --i;
    out += ' ';
  }
  return out;
}

// The file a citation names right after its closing bracket: "in core/status.h", "in
// `core/status.h`", "(cpu/modulate.cc)"; "" when none.
std::string NamedFile(absl::string_view after) {
  after = absl::StripLeadingAsciiWhitespace(after);
  if (!absl::ConsumePrefix(&after, "in ") && !absl::ConsumePrefix(&after, "(")) return "";
  after = absl::StripLeadingAsciiWhitespace(after);
  absl::ConsumePrefix(&after, "`");
  size_t n = 0;
  while (n < after.size() && (absl::ascii_isalnum(after[n]) || absl::StrContains("_./-", after[n]))) ++n;
  absl::string_view path = after.substr(0, n);
  while (absl::ConsumeSuffix(&path, ".")) {
  }
  for (absl::string_view ext : {".h", ".cc", ".cu", ".inc", ".cmake", ".md", ".py", ".txt"}) {
    if (absl::EndsWith(path, ext)) return std::string(path);
  }
  return "";
}

// Markdown code spans (`...` within a line) as [begin, end) offsets.
std::vector<std::pair<size_t, size_t>> CodeSpans(absl::string_view text) {
  std::vector<std::pair<size_t, size_t>> spans;
  size_t open = absl::string_view::npos;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n') open = absl::string_view::npos;
    if (text[i] != '`') continue;
    if (open == absl::string_view::npos) {
      open = i;
    } else {
      spans.push_back({open, i + 1});
      open = absl::string_view::npos;
    }
  }
  return spans;
}

void Scan(const std::string& file, absl::string_view text, Notes* notes) {
  const std::vector<std::pair<size_t, size_t>> spans =
      absl::EndsWith(file, ".md") ? CodeSpans(text) : std::vector<std::pair<size_t, size_t>>{};
  size_t line_start = 0;
  int line = 1;
  for (size_t at = text.find(kOpen); at != absl::string_view::npos; at = text.find(kOpen, at + 1)) {
    for (size_t nl = text.find('\n', line_start); nl < at; nl = text.find('\n', line_start)) {
      line_start = nl + 1;
      ++line;
    }
    const size_t line_end = std::min(text.size(), text.find('\n', at));
    const std::string defined = DefinitionTitle(text.substr(line_start, line_end - line_start));
    const absl::string_view leader = absl::StripAsciiWhitespace(text.substr(line_start, at - line_start));
    if (!defined.empty() && (leader == "//" || leader == "#")) {
      notes->defined[defined].push_back(file);
      continue;
    }
    bool in_span = false;
    for (const auto& [b, e] : spans) in_span |= b <= at && at < e;
    if (in_span) continue;
    const size_t title_begin = at + kOpen.size();
    const size_t close = text.find(']', title_begin);
    if (close == absl::string_view::npos || close - title_begin > 200) continue;
    std::string title = Unwrap(text.substr(title_begin, close - title_begin));
    absl::RemoveExtraAsciiWhitespace(&title);
    if (title.empty()) continue;
    const std::string after = Unwrap(text.substr(close + 1, 120));
    notes->cited.push_back({title, file, line, NamedFile(after)});
  }
}

std::vector<std::string> Problems(const Notes& notes) {
  std::vector<std::string> out;
  for (const Citation& c : notes.cited) {
    const std::string at = absl::StrCat(c.file, ":", c.line, ": ", kOpen, c.title, "]");
    auto it = notes.defined.find(c.title);
    if (it == notes.defined.end()) {
      out.push_back(absl::StrCat(at, " is defined nowhere"));
      continue;
    }
    if (c.where.empty()) continue;
    bool found = false;
    for (const std::string& f : it->second) found |= f == c.where || absl::EndsWith(f, "/" + c.where);
    if (!found) {
      out.push_back(absl::StrCat(at, " names ", c.where, ", but it stands in ", absl::StrJoin(it->second, ", ")));
    }
  }
  return out;
}

// The tree's text files: code, CMake, docs, scripts (a file starting with #!); not build trees
// (a directory holding CMakeCache.txt, or build* at the root), virtual environments, caches or data.
std::vector<std::string> TextFiles(const std::string& root) {
  std::vector<std::string> files;
  const std::vector<std::string> endings = {".h", ".cc", ".cu", ".inc", ".cmake", ".md", ".py", ".txt", ".in", ".sh"};
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    const fs::path& p = it->path();
    const std::string name = p.filename().string();
    if (it->is_directory()) {
      if (name == ".git" || name == ".venv" || name == "__pycache__" || name == ".cache" || name == "Testing" ||
          (it.depth() == 0 && absl::StartsWith(name, "build")) || fs::exists(p / "CMakeCache.txt")) {
        it.disable_recursion_pending();
      }
      continue;
    }
    if (!it->is_regular_file() || it->file_size() > (1 << 20)) continue;
    bool text = false;
    for (const std::string& e : endings) text |= absl::EndsWith(name, e);
    if (!text && p.extension().empty()) {
      std::ifstream in(p, std::ios::binary);
      char magic[2] = {};
      text = in.read(magic, 2) && magic[0] == '#' && magic[1] == '!';
    }
    if (text) files.push_back(fs::relative(p, root).generic_string());
  }
  return files;
}

// ---- the rules on small texts ------------------------------------------------------------------

std::string N(absl::string_view title) { return absl::StrCat(kOpen, title, "]"); }

TEST(Notes, ReadsDefinitionsAndCitations) {
  Notes notes;
  Scan("a.cc",
       absl::StrCat("// ", N("Alpha"), "\n// why alpha\nint x;  // See ", N("Alpha"), ".\n",
                    "  // ", N("Beta"), ": the short form\n", "# ", N("Gamma"), "\n",
                    "// ", N("Alpha"), " in a.cc explains this line\n"),
       &notes);
  EXPECT_EQ(notes.defined.size(), 3u);
  EXPECT_TRUE(notes.defined.contains("Beta"));
  ASSERT_EQ(notes.cited.size(), 2u);
  EXPECT_EQ(notes.cited[0].title, "Alpha");
  EXPECT_EQ(notes.cited[0].line, 3);
  EXPECT_EQ(notes.cited[1].where, "a.cc");
  EXPECT_TRUE(Problems(notes).empty());
}

TEST(Notes, ReadsTitlesBrokenOverLines) {
  Notes notes;
  Scan("b.cc",
       absl::StrCat("// as in (", kOpen, "Skinny\n  // prefetch] in\n// gemm.cc), and\n",
                    "  return Error(\"moved (", kOpen, "Quantized \"\n      \"tensors stay put])\");\n"),
       &notes);
  ASSERT_EQ(notes.cited.size(), 2u);
  EXPECT_EQ(notes.cited[0].title, "Skinny prefetch");
  EXPECT_EQ(notes.cited[0].where, "gemm.cc");
  EXPECT_EQ(notes.cited[1].title, "Quantized tensors stay put");
  EXPECT_EQ(notes.cited[1].line, 4);
}

TEST(Notes, FindsDanglingCitationsAndWrongFiles) {
  Notes notes;
  Scan("mesh/communicator.cc", absl::StrCat("  // ", N("Average once"), "\n"), &notes);
  Scan("docs/x.md",
       absl::StrCat("Write `// ", N("Title"), "` above the code; see ", N("Average once"),
                    " in `mesh/communicator.cc`, ", N("Average once"), " (collective.cc) and ",
                    N("Latent attention"), ".\n"),
       &notes);
  EXPECT_EQ(Problems(notes),
            (std::vector<std::string>{
                absl::StrCat("docs/x.md:1: ", N("Average once"),
                             " names collective.cc, but it stands in mesh/communicator.cc"),
                absl::StrCat("docs/x.md:1: ", N("Latent attention"), " is defined nowhere")}));
}

// ---- the source tree ---------------------------------------------------------------------------

TEST(Notes, EveryCitationInTheTreeHasItsNote) {
  Notes notes;
  const std::vector<std::string> files = TextFiles(DT_SOURCE_DIR);
  for (const std::string& f : files) {
    Scan(f, testing::ReadFileBytes(absl::StrCat(DT_SOURCE_DIR, "/", f)), &notes);
  }
  ASSERT_GE(files.size(), 300u);
  ASSERT_GE(notes.defined.size(), 50u);
  ASSERT_GE(notes.cited.size(), 300u);
  for (const std::string& problem : Problems(notes)) ADD_FAILURE() << problem;
}

}  // namespace
}  // namespace dt
